"""The phrases ``reef.learning.follow_ups`` reads a follow-up with: the default lists
behind the ``SignalsConfig`` settings (complaints, acceptances, corrections; English,
French, German and Spanish) and the fixed patterns of its structure (guards, clauses
that move on, statements of a value, what is no value)."""

from __future__ import annotations

import re

DEFAULT_COMPLAINTS = (
    r"^\W*(no|nope|nah|non|nein|not|wrong|incorrect|falsch|faux|mal)\b",
    r"\b(count|check|read|look at|do|try|work)( \w+){0,2} again\b",
    r"\b(that|this)('?s| is) not (my|the|our|a)\b",
    r"\w,\s*(not|pas|nicht|no)\s+\w|\bthat'?s the \w+( \w+)?,? not\b",
    r"\b(it'?s|it is|that'?s) \S+( \S+)? not \S",
    r"\b(doesn'?t|does not|don'?t) exist\b|\breally\?",
    r"\bnot \S+( \S+)?,? but\b|\b(instead of|rather than)\b",
    r"\b(that|this|it|you)('?s|'?re| is| are| was| were)? ?(not (right|correct|true|it)|wrong|"
    r"incorrect|mistaken)\b",
    r"\bwrong\b",
    r"\bincorrect\b",
    r"\bnot what i (asked|meant|wanted|said)\b",
    r"\bi (said|asked|meant|wrote|typed|gave you)\b",
    r"\byou (misunderstood|misread|ignored|didn'?t (read|listen|answer)|made (that|it) up)\b",
    r"\b(doesn'?t|does not|didn'?t|did not) (work|help|answer|match|fit|add up)\b",
    r"\b(doesn'?t|does not|don'?t) (look|seem|sound) (right|correct)\b",
    r"\bnot (quite|right|correct)\b",
    r"\b(close|almost),? but\b|^\W*(almost|close)\b",
    r"\b(hmm+\W+\w|actually|i think (it'?s|you)|pretty sure|i'?d (say|have said))\b",
    r"\b(are you sure|did you mean|i think you mean|how is (that|this|it))\b",
    r"\b(should|must|has to|needs to) (be|read|say|have been)\b|\bshould ?n'?t (it|that) be\b",
    r"\b(was|is)n'?t it\b",
    r"\b(mixed|mix(ed)?[- ]up|swapped|transposed|flipped|reversed|backwards|confused)\b",
    r"\bwrong (order|way round|one|number|day|month|category|department|code)\b",
    r"\bthe other way round\b|\b(isn'?t|is not|wasn'?t|was not) (my|the|our|what)\b",
    r"\bi (was hoping for|was expecting|asked for|wanted (the|a|an))\b",
    r"\byou (missed|dropped|got (that|it|the \w+( \w+)?) (backwards|wrong|in the wrong order))\b",
    r"\b(re-?check|check (that |it )?again|double-?check|look again|read (it|my message) again|"
    r"try again|redo|count again|recount|reclassify|recalculate)\b",
    r"\b(that'?s|it'?s|is|are|looks|seems) (way |a bit |slightly )?off\b|\boff by\b",
    r"\bspelling is\b|\bisn'?t even\b|\bnot a real\b",
    r"\b(it|the \w+) says\b",
    r"\bi (get|got|read|see|count) \S*\d",
    r"\?\?",
    # French
    r"\b(c'est faux|ce n'est pas|c'est pas|pas (le bon|ça|correct|juste)|erreur|"
    r"(vous avez|tu as) (inversé|confondu|mal lu)|devrait être|tromp)",
    # German
    r"\b(stimmt (\w+ )?nicht|nicht richtig|falsch\w*|verwechselt|vertauscht|sollte|nochmal prüfen|"
    r"nicht \S+ sondern)\b",
    # Spanish
    r"\b(no es correcto|incorrecto|está mal|equivoca|debería ser|revísalo|no \S+ sino)",
)
DEFAULT_ACCEPTS = (
    r"^\W*(thanks|thank you|thx|ty|cheers|perfect|great|awesome|excellent|exactly|"
    r"correct|right|yes|yep|nice|brilliant|cool|lovely|spot on|good call|sounds right)\b",
    r"\b(that|this|it) (works|worked|helps|helped|did it|is (right|correct|perfect))\b",
    r"\bthat'?s (right|correct|perfect|it|great|the one|fine)\b",
    r"\b(thanks|thank you|appreciate it|much appreciated|good enough|looks good|you got it|"
    r"nice work|well done|not bad|no complaints|can'?t argue|got it|ok(ay)?,? great)\b",
    r"\b(merci|parfait|c'est bien ça|très bien|super|danke|perfekt|genau|passt|gracias|"
    r"perfecto|correcto|exacto)\b",
)
DEFAULT_CORRECTIONS = (
    r"\b(it'?s|it is|that'?s|that is) (?P<correction>[^,.;!?]+?),? (and )?not\b",
    r"\bthe (right |correct )?answer is:? (?P<correction>[^,;!?]+?)[.!]?$",
    r"\b(it )?should (be|have been|say) (?P<correction>[^,;!?]+?)[.!]?$",
    r"\bi (said|meant|asked for) (?P<correction>[^,;!?]+?)[.!]?$",
)
# A "no"/"not" that is no complaint (module doc, rule 2).
GUARDS = (
    r"^\W*(no|non|nein)\W+(that'?s|that is|it'?s|c'est|das (ist|war'?s)|eso es) "
    r"(all|everything|it|fine|ok(ay)?|good|tout|alles|todo)\b",
    r"^\W*(no|non|nein)\W+(i'?m|we'?re) (good|fine|all set)\b",
    r"\b(no|non|nein),? (thanks|thank you|merci|danke|gracias)\b",
    r"\bno (need|worries|problem|problems|complaints)\b",
    r"\bnot (bad|too shabby)( at all)?\b",
    r"\bnothing wrong\b",
    r"\bcan'?t (argue|complain)\b",
    r"\bnot what i expected,? but\b",
    r"\bcorrect me if i'?m wrong\b",
)
# A clause that opens a new request (module doc, rule 1).
LEAD = (
    r"^\W*((no|nope|ok(ay)?|thanks|thank you|great|cool|nice|right|yes|perfect|correct|"
    r"good|merci|danke|gracias|parfait|perfecto|genau|super)\b[\W]*)*"
)
MOVES_ON = re.compile(
    LEAD + r"(now|next|also|and|then|what about|how about|can you also|could you also|"
    r"look up|check|find|try|maintenant|et|jetzt|und|ahora|y|¿y)\b|"
    r"\b(as well|next one|too\?)|\bnext\W*$",
    re.IGNORECASE,
)
BARE_NO_THEN_MOVE = re.compile(r"^\W*(no|nope|non|nein)\W*$", re.IGNORECASE)
CLAUSE_END = re.compile(r"(?<=[.!?;])\s+|,\s*(?:and|but)\s+(?=please|check|now|also|next)")

CONTRAST = (
    re.compile(
        r"(?:^|[,:;\u2014\u2013-]\s*|\b(?:it'?s|it is|that'?s|that is|is|was|says|said|wrote|meant|"
        r"c'est|es|ist|son)\s+)(?P<x>[^,;:.!?\u2014\u2013]+?),?\s+(?:and\s+)?(?:not|pas|nicht|no)\s+"
        r"(?P<y>[^,;.!?\u2014\u2013]+)",
        re.IGNORECASE,
    ),
    re.compile(
        r"\b(?:not|pas|nicht|no)\s+(?P<y>[^,;.!?]+?),?\s+(?:but|mais|sondern|sino)\s+"
        r"(?P<x>[^,;.!?]+)",
        re.IGNORECASE,
    ),
    re.compile(
        r"(?:^|\b(?:say|said)\s+)(?P<x>[^,;.!?]+?)\s+(?:instead of|rather than)\s+"
        r"(?P<y>[^,;.!?]+)",
        re.IGNORECASE,
    ),
)
STATED = re.compile(
    r"(?:\b(?:it|that|this)(?:'s|\u2019s)|"
    r"\b(?:it|that|this|the \w+(?: \w+)?|my \w+(?: \w+)?|her \w+|his \w+|its \w+|"
    r"c'|il|das|es|die \w+|el \w+(?: de \w+)?|la \w+|le \w+(?: de \w+)?|der \w+|das \w+)\s+"
    r"(?:is|was|est|ist|es|son|lautet|reads|should be|should read|should say|must be|"
    r"needs to be|has to be|should have been)|"
    r"\bshould(?:n'?t)? (?:it |that )?(?:be|read|say)|"
    r"\bi (?:said|wrote|meant|typed|get|got|read|see|count|gave you)|\bit says|"
    r"\b(?:the \w+|email|message) says|\b(?:did you|i think you) mean|\bi'?d (?:say|have said)|"
    r"\b(?:was|is)n'?t it|\bdevrait être|\bdebería ser|\bsollte|\bson|\bactually|"
    r"\bi'?m pretty sure it'?s)\s+(?:actually\s+)?"
    r"(?P<value>(?:[^,;!?]|,(?=\d))+?)\s*(?:,(?!\d)|[;!?]|\.(?:\s|$)|$)",
    re.IGNORECASE,
)
STATED_LOOSELY = re.compile(
    r"\b(?:is|was|are|were|be|'s|ist|est|es|son)\s+(?P<value>(?:[^,;!?]|,(?=\d))+?)"
    r"\s*(?:,(?!\d)|[;!?]|\.(?:\s|$)|$)",
    re.IGNORECASE,
)
BARE_LEAD = re.compile(
    r"^\W*((no|nope|non|nein|wrong|almost|close|hmm+|wait|what\?*|nah)\b\W*)+", re.IGNORECASE
)
NOT_A_VALUE = re.compile(
    r"^(the (wrong|same|next|other|time|number|biggest|acquisition|spelling)|a |an |not\b|"
    r"what\b|way\b|off\b|wrong\b|right\b|correct\b|about\b|from\b|because\b|when\b|how\b|why\b|"
    r"it\b|that\b|this\b|there\b|clearly\b|obviously\b|definitely\b|just\b|only\b|"
    r"pas\b|nicht\b|no\b|mal\b|faux\b|falsch\b|incorrect\b)",
    re.IGNORECASE,
)
FILLER = re.compile(
    r"^(in|at|on|the|a|an|clearly|obviously|definitely|really|actually)\s+", re.IGNORECASE
)
CUT = re.compile(
    r"\s+(with|because|since|for|and|but|so|please|pages?|people|priority|at least)\b.*$",
    re.IGNORECASE,
)


GUARD_PATTERNS = tuple(re.compile(p, re.IGNORECASE) for p in GUARDS)
# "the correct number is …" names a value; it accepts nothing
NAMED_RIGHT = re.compile(
    r"\b(the|le|la|der|die|das) (right|correct|bon|bonne|richtige\w*) \w+|"
    r"\b(el|la) \w+ (correcto|correcta)\b",
    re.IGNORECASE,
)
COPULA_LEAD = re.compile(
    r"^(it'?s|it is|that'?s|that is|it was|c'est|es|ist|das ist|son)\s+", re.IGNORECASE
)
# what "X, not Y" may point at the answer with
POINTING = {"that", "this", "it", "what you said", "ça", "das", "eso", "esto"}
LEADING_NO = re.compile(r"^\W*(no|nope|nah|non|nein)\b", re.IGNORECASE)
