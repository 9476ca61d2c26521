"""The ``train`` workload: one optimizer step of a whole model over tensor (TP), context (CP), pipeline (PP) and data
(DP) parallelism (docs/training.md).

What needs only the workload is checked here (pydantic's ValueError, located at the workload by the scenario
loader); what needs the cluster (``tp x cp x pp x dp`` against its GPUs) and the checks a user should see at the
exact key (``pp`` beyond the layers, micro-batches that do not divide the batch, a CP layout the sequence cannot
take, Ulysses' heads) are :func:`train_checks`, which ``run.kinds.train`` calls before anything is simulated.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from simulator.errors import InputError
from simulator.models.presets import ModelPreset
from simulator.units import DTYPE_BYTES, parse_bytes
from simulator.workloads.base import Count, SmallCount, Strict, unit_value
from simulator.workloads.decode import DType, ModelRef, Tokens, check_scope, whole_model
from simulator.workloads.prefill import model_dims
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["CP_ALGORITHMS", "DIMENSIONS", "MAX_BUCKETS", "MAX_PIPELINE_OPS", "PLACEMENT", "Parallel", "TrainWorkload",
           "train_checks"]

Dimension = Literal["tp", "cp", "pp", "dp"]
PLACEMENT: tuple[Dimension, ...] = ("tp", "cp", "pp", "dp")  # the default placement: TP fastest, then CP, PP, DP
DIMENSIONS: tuple[str, ...] = PLACEMENT  # the parallel dimensions, in the step's own order
CP_ALGORITHMS = ("ring", "allgather", "ulysses")  # the prefill schedules that run a context-parallel group


class Parallel(Strict):
    """The parallel layout: ``tp x cp x pp x dp`` GPUs. ``cp_algorithm``: the prefill schedule of attention over the
    CP group (``ring``, ``allgather``, ``ulysses``); ``layout``: how the sequence is laid over it;
    ``sequence_parallel``: TP's allreduces become reduce-scatter + all-gather and the activations outside attention
    are sharded over TP (Megatron-LM's sequence parallelism)."""

    tp: SmallCount = 1
    cp: SmallCount = 1
    pp: SmallCount = 1
    dp: SmallCount = 1
    cp_algorithm: Literal["ring", "allgather", "ulysses"] = "ring"
    layout: Literal["contiguous", "zigzag", "striped"] = "zigzag"
    sequence_parallel: bool = False
    virtual_stages: SmallCount = Field(1, description="model chunks per pipeline stage: interleaved 1F1B when > 1")

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def grad_ranks(self) -> int:
        """GPUs that reduce one gradient and share its ZeRO shards: DP x CP (Megatron-LM's data-parallel group with
        context parallelism; docs/training.md)."""
        return self.dp * self.cp

    @property
    def sizes(self) -> dict[str, int]:
        """Each dimension's degree, by name."""
        return {"tp": self.tp, "cp": self.cp, "pp": self.pp, "dp": self.dp}


class TrainWorkload(Strict):
    """One training step: ``global_batch`` tokens (or ``sequences``) of ``sequence`` tokens each, in micro-batches of
    ``micro_batch`` sequences, forward and backward through every layer, the gradients reduced over DP and the
    optimizer step (docs/training.md)."""

    kind: Literal["train"]
    model: ModelRef
    sequence: Tokens = Field(description="tokens per sequence, e.g. 131072 or '128K' (K = 2^10)")
    global_batch: Tokens | None = Field(None, description="tokens per step, e.g. '16M' (or give sequences)")
    sequences: Count | None = Field(None, description="sequences per step (or give global_batch in tokens)")
    micro_batch: Count = Field(1, description="sequences per micro-batch")
    dtype: DType = "bf16"
    parallel: Parallel = Field(default_factory=lambda: Parallel(virtual_stages=1))
    zero: Literal[0, 1, 2, 3] = Field(0, description="ZeRO stage: 1 shards optimizer states over DP, 2 gradients too, "
                                                     "3 parameters too (FSDP)")
    recompute: Literal["none", "selective", "full"] = "none"
    optimizer: Literal["adam", "sgd"] = "adam"
    bucket: float = Field(25e6, gt=0, description="bytes per DP gradient bucket, e.g. '25 MB' (PyTorch DDP's default)")
    placement: tuple[Dimension, ...] = Field(PLACEMENT, description="the order the coordinates vary in over the "
                                             "cluster's GPUs, fastest first, e.g. 'tp-cp-pp-dp' or [tp, dp, cp, pp]")

    @field_validator("bucket", mode="before")
    @classmethod
    def _bytes(cls, v: Any) -> float:
        return unit_value(parse_bytes, v, positive=True)

    @field_validator("placement", mode="before")
    @classmethod
    def _order(cls, v: Any) -> Any:
        return tuple(part.strip() for part in v.split("-")) if isinstance(v, str) else v

    @field_validator("placement")
    @classmethod
    def _permutation(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if sorted(v) != sorted(PLACEMENT):
            raise ValueError("must name each of tp, cp, pp and dp once, fastest-varying first (e.g. tp-cp-pp-dp)")
        return v

    @model_validator(mode="after")
    def _whole(self) -> TrainWorkload:
        if (self.global_batch is None) == (self.sequences is None):
            raise ValueError("give one of global_batch (tokens per step) and sequences (sequences per step)")
        check_scope("model", self.model, self.parallel.tp)
        return self

    def model_preset(self) -> ModelPreset:
        return whole_model(self.model)

    @property
    def model_name(self) -> str:
        return self.model if isinstance(self.model, str) else "custom"

    @property
    def batch_sequences(self) -> int:
        """Sequences per step (checked by :func:`train_checks` to be whole)."""
        if self.sequences is not None:
            return self.sequences
        assert self.global_batch is not None
        return self.global_batch // self.sequence

    @property
    def micro_batches(self) -> int:
        """Micro-batches per DP replica per step (m of the 1F1B schedule)."""
        return self.batch_sequences // (self.parallel.dp * self.micro_batch)

    def attention_shape(self, backward: bool) -> PrefillShape:
        """One micro-batch's attention shape (the whole model's heads; TP splits them)."""
        heads, kv_heads, head_dim = model_dims(self.model)
        return PrefillShape(batch=self.micro_batch, heads=heads, head_dim=head_dim, kv_heads=kv_heads,
                            sequence=self.sequence, dtype=self.dtype, causal=True, layout=self.parallel.layout,
                            backward=backward)


MAX_PIPELINE_OPS = 2**22  # stages x micro-batches the 1F1B timing walks
MAX_BUCKETS = 2**20  # DP gradient buckets per stage


def train_checks(wl: TrainWorkload, gpus: int) -> None:
    """Every check of a training point, each an InputError at its key (the caller locates it in the file)."""
    par, model = wl.parallel, wl.model_preset()
    if par.gpus != gpus:
        raise InputError(f"tp x cp x pp x dp = {par.tp} x {par.cp} x {par.pp} x {par.dp} = {par.gpus}, but the "
                         f"topology has {gpus} GPUs", field="workload.parallel")
    if par.pp > model.layers:
        raise InputError(f"pp ({par.pp}) is more than the model's {model.layers} layers", field="workload.parallel.pp")
    v = par.virtual_stages
    if v > 1 and par.pp == 1:
        raise InputError("interleaving needs pp > 1", field="workload.parallel.virtual_stages")
    if par.pp * v > model.layers:
        raise InputError(f"pp x virtual_stages = {par.pp} x {v} chunks is more than the model's {model.layers} layers",
                         field="workload.parallel.virtual_stages")
    if wl.global_batch is not None and wl.global_batch % wl.sequence:
        raise InputError(f"global_batch ({wl.global_batch} tokens) is not a whole number of {wl.sequence}-token "
                         f"sequences", field="workload.global_batch")
    seqs = wl.batch_sequences
    per_replica = par.dp * wl.micro_batch
    if seqs % per_replica:
        key = "workload.global_batch" if wl.global_batch is not None else "workload.sequences"
        raise InputError(f"{seqs} sequences per step do not split into micro-batches of {wl.micro_batch} over dp = "
                         f"{par.dp} replicas (dp x micro_batch = {per_replica} must divide them)", field=key)
    if par.pp * par.virtual_stages * wl.micro_batches > MAX_PIPELINE_OPS:
        raise InputError(f"pp x virtual_stages x micro-batches = {par.pp} x {par.virtual_stages} x "
                         f"{wl.micro_batches} is over {MAX_PIPELINE_OPS:,}; give fewer sequences per step or larger "
                         f"micro-batches", field="workload.micro_batch")
    buckets = model.params / par.tp / par.pp * DTYPE_BYTES[wl.dtype] / wl.bucket
    if buckets > MAX_BUCKETS:
        raise InputError(f"{buckets:.3g} gradient buckets per stage is over {MAX_BUCKETS:,}; give a larger bucket",
                         field="workload.bucket")
    if v > 1 and wl.micro_batches % par.pp:
        raise InputError(f"interleaved 1F1B needs the micro-batches per replica ({wl.micro_batches}) a multiple of pp "
                         f"({par.pp})", field="workload.parallel.virtual_stages")
    chunks = 2 * par.cp if par.layout == "zigzag" else par.cp
    if wl.sequence % chunks:
        raise InputError(f"layout {par.layout} over cp = {par.cp} cuts the sequence into {chunks} equal chunks; "
                         f"{wl.sequence} tokens do not divide by {chunks}", field="workload.parallel.layout")
    heads, kv_heads, _ = model_dims(wl.model)
    if par.cp_algorithm == "ulysses" and par.cp > 1:
        h, kv = heads // par.tp, max(1, kv_heads // par.tp)
        if h % par.cp or (kv % par.cp and par.cp % kv):
            raise InputError(f"ulysses over cp = {par.cp} needs the {h} heads per TP rank to be a multiple of cp, and "
                             f"the {kv} KV heads per TP rank a multiple or a divisor of it",
                             field="workload.parallel.cp_algorithm")

