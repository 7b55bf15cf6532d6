"""The built-in learners. Harness learners: ``fewshot`` (``FewShotLearner``),
``instructions`` (``InstructionsLearner``), ``skills`` (``SkillsLearner``), ``tools``
(``ToolsLearner``: tool descriptions and orchestration); each reads the
head's harness bundle, replaces its own part, and stores the new bundle. They raise
``NoCandidateError`` when there is nothing worth proposing. See docs/learners.md.
"""

from reef.learning.learners._errors import NoCandidateError
from reef.learning.learners.fewshot import FewShotConfig, FewShotLearner
from reef.learning.learners.instructions import InstructionsConfig, InstructionsLearner
from reef.learning.learners.skills import SkillsConfig, SkillsLearner
from reef.learning.learners.tools import ToolsConfig, ToolsLearner

__all__ = [
    "FewShotConfig",
    "FewShotLearner",
    "InstructionsConfig",
    "InstructionsLearner",
    "NoCandidateError",
    "SkillsConfig",
    "SkillsLearner",
    "ToolsConfig",
    "ToolsLearner",
]
