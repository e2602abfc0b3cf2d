"""Which component of a training checkpoint a tensor belongs to, decided by one table of rules.

A tensor segment is classified from the file it is in (its path relative to the checkpoint
folder), the key paths that reach its storage and its dtype. :data:`RULES` is read top to
bottom and the first rule that matches wins; a rule's key pattern matches when it matches *any*
of the storage's key paths, so the result does not depend on the order of the paths. Meta
segments are always ``metadata`` and never reach this module. No rule may tell one all-digit
key segment from another (``layers.7`` from ``layers.8``): :func:`classify` decides once for
keys that differ only there (tests hold the table to it).

The patterns come from the layouts in ``shared/research/formats.md`` §1.5 and §3 (HF Trainer,
plain ``torch.save``, Megatron, DeepSpeed, Lightning, DCP flattened names).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

COMPONENTS: tuple[str, ...] = (
    "weights",
    "master_weights",
    "optimizer.exp_avg",
    "optimizer.exp_avg_sq",
    "optimizer.other",
    "gradients",
    "rng_state",
    "other",
    "metadata",
)
"""Every component name, in report order."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One line of the classification table; all given conditions must hold.

    Attributes:
        component: the component assigned when the rule matches.
        key: regex searched in each key path (``.``-joined); matches if any path matches.
        file: regex searched in the file's base name.
        dtype: exact dtype name.
    """

    component: str
    key: re.Pattern[str] | None = None
    file: re.Pattern[str] | None = None
    dtype: str | None = None

    def matches(self, name: str, keys: Sequence[str], dtype: str) -> bool:
        """Whether the rule applies to a tensor in file ``name`` reached by ``keys``."""
        if self.file is not None and not self.file.search(name):
            return False
        if self.dtype is not None and dtype != self.dtype:
            return False
        key = self.key
        return key is None or any(key.search(k) for k in keys)


def _seg(alternatives: str) -> re.Pattern[str]:
    """A pattern matching one whole path segment among ``alternatives``."""
    return re.compile(rf"(?:^|\.)(?:{alternatives})(?:\.|$)")


def _leaf(alternatives: str) -> re.Pattern[str]:
    """A pattern matching the last path segment."""
    return re.compile(rf"(?:^|\.)(?:{alternatives})$")


_MASTER = (
    r"fp32_from_fp16_params|fp32_from_fp16|fp32_from_float16|single_partition_of_fp32_groups"
    r"|fp32_flat_groups|fp32_groups_flat\w*|fp32_partitioned_groups_flat|fp32_param|master_params"
    r"|master_weights|main_params"
)
_OPTIMIZER_CONTEXT = r"optimizer\w*|optim|optim_state\w*|base_optimizer_state|optimizer_states"
_OPTIMIZER_LEAVES = (
    r"momentum_buffer|exp_avg_sq_row|exp_avg_sq_col|row_var|col_var|square_avg|grad_avg|acc_delta"
)
_MODEL_ROOTS = r"model\d*|module|state_dict|model_state_dict|model_state|net|network|ema|ema_model"
_WEIGHT_LEAVES = r"weight|bias|running_mean|running_var|num_batches_tracked|inv_freq"

RULES: tuple[Rule, ...] = (
    # HF Trainer's rng_state.pth / rng_state_<rank>.pth hold only generator states.
    Rule("rng_state", file=re.compile(r"^rng_state(_\d+)?\.pth$")),
    Rule("gradients", key=_seg(r"grad|grads|gradients|main_grad")),
    # Files saved to hold gradients (`gradients.pt`, `grads_rank0.pt`) name them by parameter.
    Rule(
        "gradients",
        file=re.compile(r"^(?:[^/]*[_-])?grad(?:s|ients)?(?:[_-][^/]*)?\.(?:pt|pth|bin|safetensors)$"),
    ),
    # Megatron rng_state.N.{torch_rng_state,cuda_rng_state,rng_tracker_states}; Lightning/torchtitan too.
    Rule("rng_state", key=_seg(r"[^.]*rng[^.]*")),
    Rule("rng_state", key=_leaf(r"cpu|cuda(_\d+)?|xla|npu|mps"), dtype="uint8"),
    # Master copies before moments: DeepSpeed keeps them inside optimizer_state_dict.
    Rule("master_weights", key=_seg(_MASTER)),
    # max_exp_avg_sq (amsgrad) is a second moment; Adafactor's row/col factors are not.
    Rule("optimizer.exp_avg_sq", key=_seg(r"exp_avg_sq|max_exp_avg_sq")),
    Rule("optimizer.exp_avg", key=_seg(r"exp_avg")),
    Rule("optimizer.other", key=_seg(_OPTIMIZER_CONTEXT)),
    # A bare optimizer.state_dict(): state.<param index>.<name>.
    Rule("optimizer.other", key=re.compile(r"(?:^|\.)state\.\d+\.")),
    Rule("optimizer.other", key=_leaf(_OPTIMIZER_LEAVES)),
    Rule("weights", key=re.compile(rf"^(?:{_MODEL_ROOTS})(?:\.|$)")),
    Rule("weights", key=_seg(r"_parameters|_buffers")),
    # After the model roots: Megatron's model_optim_rng.pt holds the model too.
    Rule("optimizer.other", file=re.compile(r"optim")),
    Rule("weights", file=re.compile(r"\.safetensors$|^(pytorch_)?model[^/]*\.(bin|pt|pth)$")),
    Rule("weights", key=_leaf(_WEIGHT_LEAVES)),
)
"""The classification table, first match wins."""


def _basename(relpath: str) -> str:
    return re.split(r"[/\\]", relpath)[-1]


@functools.lru_cache(maxsize=256)
def _rules_for(name: str, dtype: str) -> tuple[tuple[str, re.Pattern[str] | None], ...]:
    """:data:`RULES` as they apply in file ``name`` to ``dtype``: each rule whose file and
    dtype conditions hold, as (component, key pattern or None), up to the first that needs
    no key (it always matches, so none after it is ever reached). A checkpoint file holds
    thousands of tensors of a few dtypes (an unfused MoE shard tens of thousands), so this
    is decided once per file and dtype, and a tensor pays only for the key patterns."""
    live: list[tuple[str, re.Pattern[str] | None]] = []
    for rule in RULES:
        if rule.file is not None and not rule.file.search(name):
            continue
        if rule.dtype is not None and dtype != rule.dtype:
            continue
        live.append((rule.component, rule.key))
        if rule.key is None:
            break
    return tuple(live)


#: A key path's segments that are all digits (list indices, layer numbers, parameter ids).
_NUMBER = re.compile(r"(?<![^.])\d+(?![^.])")


def classify(relpath: str, keys: Sequence[str], dtype: str) -> str:
    """Return the component of a tensor segment.

    Args:
        relpath: the file's path relative to the checkpoint folder (``checkpoint-5/optimizer.pt``).
        keys: every key path that reaches the tensor's storage (``state.3.exp_avg``).
        dtype: the segment's dtype name.

    Returns:
        One of :data:`COMPONENTS` other than ``metadata``.
    """
    # No rule tells one all-digit segment from another (``layers.7.`` from ``layers.8.``),
    # so tensors whose keys differ only there share one decision.
    return _classify(_basename(relpath), tuple(_NUMBER.sub("0", k) for k in keys), dtype)


@functools.lru_cache(maxsize=4096)
def _classify(name: str, keys: tuple[str, ...], dtype: str) -> str:
    for component, key in _rules_for(name, dtype):
        if key is None:
            return component
        for k in keys:
            if key.search(k):
                return component
    return "other"
