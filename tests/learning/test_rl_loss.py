"""Reef's GRPO objective (``reef.learning.trainers.rl_loss``) against TRL's: the same
tiny Llama, batch, sampling and reference log-probs and advantages give TRL
``GRPOTrainer._compute_loss``'s loss and gradients, for every ``loss_type``; and a
batch from a policy two updates old gives ratios away from 1, clipped on the side the
advantage says."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

# PEFT 0.21 reads a deprecated transformers property while wrapping a model.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is_gradient_checkpointing. is deprecated:FutureWarning"
)

PROMPT = 6
COMPLETIONS = (5, 3, 7, 4, 6, 2)
ADVANTAGES = (1.1, -0.9, 0.4, -1.3, 0.0, 0.8)
MAX_COMPLETION = 8
TRL_NAME = {"sequence_sum": "luspo"}


def tiny_llama(fused: bool) -> Any:
    """A seeded two-layer Llama with a LoRA on q and v whose B is not zero (so every
    LoRA weight gets a gradient); ``fused``: with TRL's fused head added first, as
    ``GRPOTrainer`` does."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    base = LlamaForCausalLM(config)
    if fused:
        add_fused_lm_head(base, temperature=1.0, outputs=("log_probs", "entropy"))
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    lora.init_lora_weights = False
    model = get_peft_model(base, lora)
    model.train()
    return model


class _Accelerator:
    """What ``_compute_loss`` asks of an accelerator, on one process."""

    num_processes = 1
    is_main_process = True

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def gather(self, tensor: Any) -> Any:
        return tensor

    gather_for_metrics = gather

    def reduce(self, tensor: Any, reduction: str = "sum") -> Any:
        return tensor


class MinimalGRPO:
    """The state ``GRPOTrainer._compute_loss`` and its log-prob helper read, and those
    two methods of TRL's class, unchanged. ``GRPOTrainer.__init__`` needs a dataset,
    reward functions and a generation backend, none of which the loss touches; the
    settings below are TRL's for one process, no gradient accumulation, no vLLM."""

    _compute_loss = trl.GRPOTrainer._compute_loss
    _get_per_token_logps_and_entropies = trl.GRPOTrainer._get_per_token_logps_and_entropies

    def __init__(self, model: Any, loss_type: str, beta: float, high: float) -> None:
        self.model = model
        self.loss_type = loss_type
        self.beta = beta
        self.epsilon_low = 0.2
        self.epsilon_high = high
        self.max_completion_length = MAX_COMPLETION
        self.importance_sampling_level = "token"
        self.top_entropy_quantile = 1.0
        self.off_policy_mask_threshold = None
        self.aux_loss_enabled = False
        self.use_vllm = False
        self._entropy_bonus_enabled = False
        self.current_gradient_accumulation_steps = 1
        self.accelerator = _Accelerator()
        self.args = SimpleNamespace(
            use_bias_correction_kl=False, delta=None, steps_per_generation=1
        )
        self._metrics: dict[str, Any] = {"train": defaultdict(list), "eval": defaultdict(list)}


def sequences() -> tuple[list[list[int]], list[list[int]]]:
    """Prompts of one length (no left padding, so both sides see the same positions)
    and completions of several, ids drawn from a seeded generator."""
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 64, (PROMPT,), generator=generator).tolist() for _ in COMPLETIONS]
    completions = [torch.randint(3, 64, (n,), generator=generator).tolist() for n in COMPLETIONS]
    return prompts, completions


def trl_inputs(
    prompts: list[list[int]], completions: list[list[int]], old: Any, ref: Any
) -> dict[str, Any]:
    width = max(COMPLETIONS)
    ids = torch.zeros(len(completions), width, dtype=torch.long)
    mask = torch.zeros(len(completions), width, dtype=torch.long)
    for row, completion in enumerate(completions):
        ids[row, : len(completion)] = torch.tensor(completion)
        mask[row, : len(completion)] = 1
    return {
        "prompt_ids": torch.tensor(prompts),
        "prompt_mask": torch.ones(len(prompts), PROMPT, dtype=torch.long),
        "completion_ids": ids,
        "completion_mask": mask,
        "advantages": torch.tensor(ADVANTAGES),
        "old_per_token_logps": old * mask,
        "ref_per_token_logps": ref * mask,
        "num_items_in_batch": mask.sum(),
    }


def reef_batch(prompts: list[list[int]], completions: list[list[int]]) -> dict[str, Any]:
    from reef.learning.trainers.lora_sft import IGNORE_INDEX, Features, collate

    features = [
        Features(p + c, [IGNORE_INDEX] * len(p) + c, 1.0)
        for p, c in zip(prompts, completions, strict=True)
    ]
    return collate(features, 0, torch.device("cpu"))


def grads(model: Any) -> dict[str, Any]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@contextlib.contextmanager
def fresh_grads(model: Any) -> Iterator[None]:
    model.zero_grad(set_to_none=True)
    yield


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "grpo", "dr_grpo", "sequence_sum"])
def test_the_loss_and_its_gradients_are_trl_s(loss_type: str, beta: float) -> None:
    """Against TRL's own ``_compute_loss`` and per-token log-prob helper, on a minimal
    trainer object (``MinimalGRPO``). ``sequence_sum`` is TRL's ``luspo`` at token-level
    importance sampling. The sampling log-probs are the policy's moved by seeded noise,
    so ratios fall on both sides of the clip range (asymmetric: 0.2 below, 0.28 above);
    one completion has advantage 0."""
    from reef.learning.trainers.lora_sft import token_logps
    from reef.learning.trainers.rl_loss import LossSettings, clipped_loss, sequence_weights

    model = tiny_llama(fused=True)
    prompts, completions = sequences()
    batch = reef_batch(prompts, completions)
    with torch.no_grad():
        policy, rows = token_logps(model, batch)
    generator = torch.Generator().manual_seed(2)
    old_flat = policy + 0.4 * torch.randn(policy.shape, generator=generator)
    ref_flat = policy + 0.3 * torch.randn(policy.shape, generator=generator)
    mask = trl_inputs(prompts, completions, torch.zeros(1), torch.zeros(1))["completion_mask"]
    old, ref = torch.zeros(mask.shape), torch.zeros(mask.shape)
    old[mask.bool()], ref[mask.bool()] = old_flat, ref_flat
    ratio = torch.exp(policy - old_flat)
    assert (ratio < 0.8).any() and (ratio > 1.28).any()

    trainer = MinimalGRPO(model, TRL_NAME.get(loss_type, loss_type), beta, 0.28)
    with fresh_grads(model):
        theirs = trainer._compute_loss(model, trl_inputs(prompts, completions, old, ref))
        theirs.backward()
        their_grads = grads(model)

    settings = LossSettings(loss_type, 0.2, 0.28, beta, MAX_COMPLETION)  # type: ignore[arg-type]
    with fresh_grads(model):
        policy, rows = token_logps(model, batch)
        lengths = torch.bincount(rows, minlength=len(COMPLETIONS))
        weights = sequence_weights(settings, lengths)[rows]
        advantages = torch.tensor(ADVANTAGES)[rows]
        ref_arg = ref_flat if beta else None
        ours = clipped_loss(settings, policy, old_flat, ref_arg, advantages, weights)
        ours.loss.backward()
        our_grads = grads(model)

    assert float(ours.loss.detach()) == pytest.approx(float(theirs.detach()), abs=1e-5, rel=1e-5)
    assert their_grads and their_grads.keys() == our_grads.keys()
    assert any(g.abs().max() > 1e-4 for g in their_grads.values())
    for name, grad in their_grads.items():
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-4, atol=1e-7, msg=name)
    # The clip tallies are TRL's metrics, as token counts.
    metrics = trainer._metrics["train"]
    tokens = sum(COMPLETIONS)
    assert ours.clipped_low / tokens == pytest.approx(metrics["clip_ratio/low_mean"][0])
    assert ours.clipped_high / tokens == pytest.approx(metrics["clip_ratio/high_mean"][0])
    if beta:
        assert ours.kl_sum / tokens == pytest.approx(metrics["kl"][0], rel=1e-5)


def test_a_batch_two_updates_old_is_corrected_and_clipped() -> None:
    """A batch sampled (``generate``) by the policy, then two updates of the policy on
    it: its ratios against the sampling log-probs are no longer 1, and exactly the
    tokens whose ratio left the clip range on the side the advantage pushes (below
    ``1 - epsilon`` with A < 0, above ``1 + epsilon_high`` with A > 0) stop giving a
    gradient; every other token's is ``-A * ratio * weight``."""
    from reef.learning.trainers.lora_sft import IGNORE_INDEX, Features, collate, token_logps
    from reef.learning.trainers.rl_loss import (
        LossSettings,
        clipped_loss,
        old_logps,
        sequence_weights,
    )

    model = tiny_llama(fused=False)
    torch.manual_seed(3)
    prompt = torch.randint(3, 64, (1, PROMPT))
    out = model.generate(
        input_ids=prompt,
        attention_mask=torch.ones_like(prompt),
        do_sample=True,
        max_new_tokens=MAX_COMPLETION,
        num_return_sequences=6,
        top_k=0,
        pad_token_id=0,
        eos_token_id=None,
    )
    ids = out[:, PROMPT:].tolist()
    features = [Features(prompt[0].tolist() + c, [IGNORE_INDEX] * PROMPT + c, 1.0) for c in ids]
    batch = collate(features, 0, torch.device("cpu"))
    settings = LossSettings("dapo", 0.25, 0.15, 0.0, MAX_COMPLETION)  # asymmetric
    advantages_of = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    with torch.no_grad():
        sampled, rows = token_logps(model, batch)
    recorded = [sampled[rows == row].tolist() for row in range(6)]

    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)
    lengths = torch.bincount(rows, minlength=6)
    weights = sequence_weights(settings, lengths)[rows]
    advantages = advantages_of[rows]
    for _ in range(2):  # two updates on the batch: it is now two steps old
        optimizer.zero_grad()
        policy, _ = token_logps(model, batch)
        old = old_logps(policy, list(zip(lengths.tolist(), recorded, strict=True)))
        clipped_loss(settings, policy, old, None, advantages, weights).loss.backward()
        optimizer.step()

    with torch.no_grad():
        policy, _ = token_logps(model, batch)
    old = old_logps(policy, list(zip(lengths.tolist(), recorded, strict=True)))
    torch.testing.assert_close(old, sampled)
    ratio = torch.exp(policy - old)
    assert (ratio - 1).abs().max() > 0.3
    low = (ratio < 0.75) & (advantages < 0)
    high = (ratio > 1.15) & (advantages > 0)
    assert low.any() and high.any()  # both sides of the clip range are reached

    leaf = policy.clone().requires_grad_()
    parts = clipped_loss(settings, leaf, old, None, advantages, weights)
    parts.loss.backward()
    assert parts.clipped_low == int(low.sum()) and parts.clipped_high == int(high.sum())
    clipped = low | high
    assert leaf.grad is not None
    assert torch.all(leaf.grad[clipped] == 0)
    expected = -(advantages * ratio * weights)[~clipped]
    torch.testing.assert_close(leaf.grad[~clipped], expected)
    # A ratio out of range on the side that does not help is not clipped (PPO's min).
    assert torch.all(leaf.grad[(ratio > 1.15) & (advantages < 0)] != 0)
    assert torch.all(leaf.grad[(ratio < 0.75) & (advantages > 0)] != 0)


def test_recorded_log_probs_are_used_where_complete() -> None:
    from reef.learning.trainers.rl_loss import old_logps

    policy = torch.tensor([-1.0, -2.0, -3.0, -4.0, -5.0], requires_grad=True)
    old = old_logps(policy, [(2, [-1.5, -2.5]), (2, None), (1, [-9.0, -9.0])])
    assert old.tolist() == [-1.5, -2.5, -3.0, -4.0, -5.0]  # a short record is not used
    assert not old.requires_grad
    with pytest.raises(ValueError, match="4 tokens"):
        old_logps(policy, [(2, None), (2, None)])


def test_advantages_are_trl_s() -> None:
    """Group-relative advantages as TRL's ``scale_rewards: group`` computes them (its
    ``nanstd`` has Bessel's correction)."""
    from trl.trainer.utils import nanstd

    from reef.learning.trainers.grpo import group_advantages

    rewards = [1.0, 0.0, 0.0, 0.5, 1.0]
    tensor = torch.tensor(rewards)
    theirs = (tensor - tensor.mean()) / (nanstd(tensor) + 1e-4)
    torch.testing.assert_close(torch.tensor(group_advantages(rewards)), theirs)
    assert group_advantages([0.3]) == [0.0]
