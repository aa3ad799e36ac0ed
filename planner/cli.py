"""The `planner` command. Commands parse flags, call one runner and hand its result to a renderer;
heavy imports (pydantic, the cost model) happen inside the commands so `planner --help` is fast."""

from __future__ import annotations

import sys
from pathlib import Path
from contextlib import contextmanager
from typing import Annotated, Optional
from collections.abc import Iterator

import typer

from cost_models.enums import AttentionBackend, AttentionKernel, Fp8Recipe, Framework, MoEDispatch, OptimizerKind, Precision, Recompute, Schedule
from planner import __version__
from planner.validate import Backend as ValidateBackend
from planner.launch.options import DEFAULT_PORT, MegatronFsdp, TitanVersion

app = typer.Typer(
    help="Find the fastest parallel layout for training an LLM on a GPU cluster, and say why.",
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    rich_markup_mode=None,
)

EXIT_USAGE = 2


@contextmanager
def _user_errors() -> Iterator[None]:
    """User-fixable problems become one line on stderr and exit code 2."""
    from cost_models.errors import SpecError
    from planner.text import printable

    try:
        yield
    except SpecError as e:
        print(f"error: {printable(str(e))}", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE) from None
    except OSError as e:  # a file system fault the writers did not name (they name the flag too)
        where = f"{printable(str(e.filename))}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE) from None


def _version(value: bool) -> None:
    if value:
        print(f"planner {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    from planner.text import fit_streams

    fit_streams()


# Options shared by memory (and later estimate/plan). Defaults of None mean "derive".
Model = Annotated[str, typer.Argument(help="Preset name, spec file (.toml/.json/.yaml) or Hugging Face config.json / directory.")]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="Cluster preset name or cluster spec file.")]
Gpus = Annotated[int, typer.Option("--gpus", "-g", help="Number of GPUs.")]
IntOpt = Optional[int]


# Layout and training flags shared by memory and estimate (and later plan).
Tp = Annotated[IntOpt, typer.Option("--tp", help="Tensor-parallel size.")]
Pp = Annotated[IntOpt, typer.Option("--pp", help="Pipeline-parallel size.")]
Vpp = Annotated[IntOpt, typer.Option("--vpp", help="Virtual pipeline chunks per rank (interleaved).")]
Cp = Annotated[IntOpt, typer.Option("--cp", help="Context-parallel size.")]
Ep = Annotated[IntOpt, typer.Option("--ep", help="Expert-parallel size.")]
Etp = Annotated[IntOpt, typer.Option("--etp", help="Expert tensor-parallel size (default: framework's).")]
Mbs = Annotated[IntOpt, typer.Option("--mbs", help="Micro-batch size (sequences).")]
Sp = Annotated[Optional[bool], typer.Option("--sp/--no-sp", help="Sequence parallel (default: on when tp > 1).")]
ZeroOpt = Annotated[IntOpt, typer.Option("--zero", help="Data-parallel sharding: 0 none, 1 optimizer, 2 +grads, 3 +params.")]
DpShard = Annotated[IntOpt, typer.Option("--dp-shard", help="HSDP: shard within groups of this many dp ranks.")]
RecomputeOpt = Annotated[Optional[Recompute], typer.Option("--recompute", help="Activation recomputation.")]
RecomputeLayers = Annotated[IntOpt, typer.Option("--recompute-layers", help="Full recompute of only the first K layers of each model chunk (each stage without vpp).")]
ScheduleOpt = Annotated[Optional[Schedule], typer.Option("--schedule", help="Pipeline schedule (default: interleaved if vpp > 1).")]
PpFirst = Annotated[IntOpt, typer.Option("--pp-first-layers", help="Decoder layers on the first pipeline stage.")]
PpLast = Annotated[IntOpt, typer.Option("--pp-last-layers", help="Decoder layers on the last pipeline stage.")]
AccountEmb = Annotated[Optional[bool], typer.Option("--account-for-embedding", help="Count the embedding as a pipeline layer of the first stage (Megatron --account-for-embedding-in-pipeline-split).", show_default=False)]
AccountLoss = Annotated[Optional[bool], typer.Option("--account-for-loss", help="Count the loss as a pipeline layer of the last stage (Megatron --account-for-loss-in-pipeline-split).", show_default=False)]
GradBf16 = Annotated[Optional[bool], typer.Option("--grad-reduce-in-bf16", help="Megatron: keep and reduce gradients in bf16 instead of fp32 main grads (2 bytes per parameter).", show_default=False)]
VocabDivisibleBy = Annotated[IntOpt, typer.Option("--vocab-divisible-by", help="Megatron: the --make-vocab-size-divisible-by the run uses; the embedding and output layer get the vocabulary rounded up to a multiple of this·tp (default: the largest power of two up to 128 that pads nothing, as launch writes).", show_default=False)]
PpLayout = Annotated[Optional[str], typer.Option("--pp-layout", help="Every stage's layers in Megatron's --pipeline-model-parallel-layout grammar, e.g. 'Et*3|(tt|)*29|tL'; sets vpp.")]
SeqLen = Annotated[IntOpt, typer.Option("--seq-len", help="Sequence length (default 4096).")]
GlobalBatch = Annotated[IntOpt, typer.Option("--global-batch-size", help="Sequences per step (default: mbs·dp, ×4·pp with a pipeline).")]
FrameworkOpt = Annotated[Optional[Framework], typer.Option("--framework", help="Training framework (default megatron).")]
Dtype = Annotated[Optional[Precision], typer.Option("--dtype", help="Compute precision (default bf16; fp4: Transformer Engine NVFP4 GEMMs, Megatron on Blackwell).")]
Fp8RecipeOpt = Annotated[Optional[Fp8Recipe], typer.Option("--fp8-recipe", help="fp8 scaling with --dtype fp8 (default tensorwise: Megatron TE current scaling; delayed: Megatron TE delayed scaling; rowwise: torchao; mxfp8: Blackwell).")]
OptimizerOpt = Annotated[Optional[OptimizerKind], typer.Option("--optimizer", help="Optimizer (default adamw).")]
AttentionOpt = Annotated[Optional[AttentionKernel], typer.Option("--attention", help="Attention kernel (default flash).")]
Compile = Annotated[Optional[bool], typer.Option("--compile/--no-compile", help="torch.compile the model and loss (torchtitan).")]
TpOverlap = Annotated[Optional[bool], typer.Option("--tp-comm-overlap/--no-tp-comm-overlap", help="Overlap tp communication with GEMMs (Megatron --tp-comm-overlap, torchtitan async TP).")]
AttnBackendOpt = Annotated[Optional[AttentionBackend], typer.Option("--attention-backend", help="Fused attention kernel family (default: the framework's choice on the GPU).")]
MoeDispatchOpt = Annotated[Optional[MoEDispatch], typer.Option("--moe-dispatch", help="MoE token exchange: alltoall on the compute stream, overlap (Megatron --overlap-moe-expert-parallel-comm), or deepep (DeepEP's kernels: Megatron's flex dispatcher, torchtitan 0.2's expert_parallel_comm_backend).")]
MoeLoadOpt = Annotated[Optional[float], typer.Option("--moe-load-factor", help="Tokens the busiest expert-parallel rank receives over the mean (default 1: balanced).")]
Fp8ParamsOpt = Annotated[Optional[bool], typer.Option("--fp8-param-gather/--no-fp8-param-gather", help="Keep weights in fp8 and gather them in fp8 (Megatron --fp8-param-gather; --dtype fp8).")]
Fp8AttnOpt = Annotated[Optional[bool], typer.Option("--fp8-attention/--no-fp8-attention", help="Run attention in fp8 (Transformer Engine's fp8 dot-product attention on cuDNN, Megatron's fp8_dot_product_attention; --dtype fp8 or fp4, Hopper or Blackwell).")]
Headroom = Annotated[Optional[float], typer.Option("--headroom", help="Fraction of HBM kept free when judging fit (default 5%).")]
TitanVersionOpt = Annotated[TitanVersion, typer.Option("--torchtitan-version", help="torchtitan 0.3.x (flags and --module/--config) or 0.2.x (TOML).")]
TitanModelOpt = Annotated[Optional[str], typer.Option("--torchtitan-model", help="torchtitan registry entry, MODULE:CONFIG (0.3) or NAME:FLAVOR (0.2); default: the one of the model's shape.")]
MegatronFsdpOpt = Annotated[MegatronFsdp, typer.Option("--megatron-fsdp", help="Megatron's sharding for zero 2/3: Megatron-FSDP or torch FSDP2.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
FloatOpt = Optional[float]
Tokens = Annotated[FloatOpt, typer.Option("--tokens", help="Tokens to train: days, GPU-hours (and cost) to train them.")]
GpuHourCost = Annotated[FloatOpt, typer.Option("--gpu-hour-cost", help="Price of one GPU-hour, for the cost of --tokens.")]
CkptWrite = Annotated[FloatOpt, typer.Option("--ckpt-write-gbps", help="Aggregate checkpoint write bandwidth, GB/s (default: Llama 3's 2 TB/s over 16,384 GPUs, per GPU, times the GPUs).")]
GpuMtbf = Annotated[FloatOpt, typer.Option("--gpu-mtbf-hours", help="Mean time between failures of one GPU, hours (default from Llama 3's 419 interruptions in 54 days on 16,384 GPUs).")]
_OUTLOOK = {"tokens", "gpu_hour_cost", "ckpt_write_gbps", "gpu_mtbf_hours"}
TimeLimit = Annotated[FloatOpt, typer.Option(
    "--time-limit", help="Seconds the search may run (default 30); it then ranks the plans scored so far, not proven the fastest.",
)]


def _outlook(tokens, gpu_hour_cost, ckpt_write_gbps, gpu_mtbf_hours):  # type: ignore[no-untyped-def]
    from planner.runners import Outlook

    return Outlook(tokens=tokens, gpu_hour_cost=gpu_hour_cost, ckpt_write_gb_per_s=ckpt_write_gbps, gpu_mtbf_hours=gpu_mtbf_hours)


def _specs(
    *, tp, pp, vpp, cp, ep, etp, mbs, sp, zero, dp_shard, recompute, recompute_layers, schedule, pp_first, pp_last,
    account_for_embedding, account_for_loss, pp_layout,
    seq_len, global_batch_size, framework, dtype, fp8_recipe, optimizer, attention, compile, tp_comm_overlap,
    attention_backend, moe_dispatch, moe_load_factor, fp8_param_gather, grad_reduce_in_bf16, vocab_divisible_by,
    fp8_attention,
) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """(training, layout) field dicts from the shared flags; None = derive."""
    layout = dict(
        tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, mbs=mbs, sp=sp, zero=zero, dp_shard=dp_shard,
        recompute=recompute, recompute_layers=recompute_layers, schedule=schedule,
        pp_first_stage_layers=pp_first, pp_last_stage_layers=pp_last,
        account_for_embedding=account_for_embedding, account_for_loss=account_for_loss, pp_layout=pp_layout,
    )
    training = _training(
        seq_len=seq_len, global_batch_size=global_batch_size, framework=framework, dtype=dtype, fp8_recipe=fp8_recipe,
        optimizer=optimizer, attention=attention, compile=compile, tp_comm_overlap=tp_comm_overlap,
        attention_backend=attention_backend, moe_dispatch=moe_dispatch, moe_load_factor=moe_load_factor,
        fp8_param_gather=fp8_param_gather, fp8_attention=fp8_attention, grad_reduce_in_bf16=grad_reduce_in_bf16, vocab_divisible_by=vocab_divisible_by,
    )
    return training, layout


def _training(*, seq_len, global_batch_size, framework, dtype, fp8_recipe, optimizer, attention, compile, tp_comm_overlap,
              attention_backend=None, moe_dispatch=None, moe_load_factor=None, fp8_param_gather=None,
              grad_reduce_in_bf16=None, vocab_divisible_by=None, fp8_attention=None) -> dict:  # type: ignore[no-untyped-def]
    """TrainingSpec fields from the training flags; None = default."""
    return dict(
        seq_len=seq_len, global_batch_size=global_batch_size, framework=framework, precision=dtype,
        fp8_recipe=fp8_recipe, optimizer=optimizer, attention=attention, compile=compile, tp_comm_overlap=tp_comm_overlap,
        attention_backend=attention_backend, moe_dispatch=moe_dispatch, moe_load_factor=moe_load_factor,
        fp8_param_gather=fp8_param_gather, fp8_attention=fp8_attention, grad_reduce_in_bf16=grad_reduce_in_bf16, vocab_divisible_by=vocab_divisible_by,
    )


def _options_of(source, *, skip: set[str]):  # type: ignore[no-untyped-def]
    """Give the decorated command (whose last parameter is **flags) the options of `source`, so
    both take one list of flags rather than two copies of it."""
    import inspect

    def decorate(func):  # type: ignore[no-untyped-def]
        own = [p for p in inspect.signature(func, eval_str=True).parameters.values() if p.kind is not p.VAR_KEYWORD]
        names = {p.name for p in own} | skip
        shared = [p for p in inspect.signature(source, eval_str=True).parameters.values() if p.name not in names]
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own + shared]
        func.__signature__ = inspect.Signature(params)
        return func

    return decorate


@app.command()
def memory(
    model: Model, cluster: ClusterOpt, gpus: Gpus,
    tp: Tp = None, pp: Pp = None, vpp: Vpp = None, cp: Cp = None, ep: Ep = None, etp: Etp = None, mbs: Mbs = None,
    sp: Sp = None, zero: ZeroOpt = None, dp_shard: DpShard = None, recompute: RecomputeOpt = None,
    recompute_layers: RecomputeLayers = None, schedule: ScheduleOpt = None, pp_first: PpFirst = None, pp_last: PpLast = None,
    account_for_embedding: AccountEmb = None, account_for_loss: AccountLoss = None, pp_layout: PpLayout = None,
    seq_len: SeqLen = None, global_batch_size: GlobalBatch = None, framework: FrameworkOpt = None, dtype: Dtype = None,
    fp8_recipe: Fp8RecipeOpt = None, optimizer: OptimizerOpt = None, attention: AttentionOpt = None, compile: Compile = None, tp_comm_overlap: TpOverlap = None,
    attention_backend: AttnBackendOpt = None, moe_dispatch: MoeDispatchOpt = None, moe_load_factor: MoeLoadOpt = None,
    fp8_param_gather: Fp8ParamsOpt = None, fp8_attention: Fp8AttnOpt = None, grad_reduce_in_bf16: GradBf16 = None, vocab_divisible_by: VocabDivisibleBy = None,
    headroom: Headroom = None, as_json: AsJson = False,
    png: Annotated[Optional[Path], typer.Option("--png", help="Also draw each stage's memory by component into this PNG (needs the plots extra).")] = None,
) -> None:
    """Per-GPU memory of one layout: every component, every pipeline stage, and whether it fits."""
    flags = {k: v for k, v in locals().items() if k not in _NOT_SPECS | {"png"}}
    with _user_errors():
        from planner.runners import run_memory

        training, layout = _specs(**flags)
        if png is not None:
            from planner.plots import check_png

            check_png(png)
        report = run_memory(model, cluster, gpus, training=training, layout=layout, headroom=headroom, flags=True)
        if png is not None:
            from planner.plots import memory_png

            memory_png(report, png)
    if as_json:
        from planner.render import print_json

        print_json(report.to_json())
    else:
        from rich.console import Console

        from planner.render import render_memory

        render_memory(report, Console())


_NOT_SPECS = {"model", "cluster", "gpus", "headroom", "as_json", "calibration"}


@app.command()
@_options_of(memory, skip={"as_json", "png"})
def estimate(
    calibration: Annotated[Optional[Path], typer.Option("--calibration", help="JSON file of per-GPU corrections to the kernel prices (from validate --calibrate).")] = None,
    tokens: Tokens = None, gpu_hour_cost: GpuHourCost = None, ckpt_write_gbps: CkptWrite = None, gpu_mtbf_hours: GpuMtbf = None,
    as_json: AsJson = False,
    **flags,  # type: ignore[no-untyped-def]
) -> None:
    """Step time, throughput and MFU of one layout, with its memory: every term, and the bottleneck."""
    model, cluster, gpus, headroom = (flags.pop(k) for k in ("model", "cluster", "gpus", "headroom"))
    with _user_errors():
        from cost_models.calibration import DEFAULT
        from planner.files import load_calibration
        from planner.runners import run_estimate

        training, layout = _specs(**flags)
        cal = load_calibration(calibration) if calibration else DEFAULT
        report = run_estimate(model, cluster, gpus, training=training, layout=layout, headroom=headroom, calibration=cal,
                              flags=True, outlook=_outlook(tokens, gpu_hour_cost, ckpt_write_gbps, gpu_mtbf_hours))
    if as_json:
        from planner.render import print_json

        print_json(report.to_json())
    else:
        from rich.console import Console

        from planner.render import render_estimate

        render_estimate(report, Console())


@app.command()
def plan(
    model: Model, cluster: ClusterOpt, gpus: Gpus,
    seq_len: SeqLen = None,
    global_batch_size: Annotated[IntOpt, typer.Option("--global-batch-size", help="Sequences per step (default: 4M tokens / seq len).")] = None,
    framework: FrameworkOpt = None, dtype: Dtype = None, fp8_recipe: Fp8RecipeOpt = None, optimizer: OptimizerOpt = None,
    attention: AttentionOpt = None, compile: Compile = None, tp_comm_overlap: TpOverlap = None,
    attention_backend: AttnBackendOpt = None, moe_dispatch: MoeDispatchOpt = None, moe_load_factor: MoeLoadOpt = None,
    fp8_param_gather: Fp8ParamsOpt = None, fp8_attention: Fp8AttnOpt = None, grad_reduce_in_bf16: GradBf16 = None, vocab_divisible_by: VocabDivisibleBy = None,
    top: Annotated[int, typer.Option("--top", help="How many plans to list.")] = 10,
    fix: Annotated[Optional[list[str]], typer.Option("--fix", help="Pin an axis, e.g. --fix tp=8 --fix recompute=full.")] = None,
    allow_cross_node_tp: Annotated[bool, typer.Option("--allow-cross-node-tp", help="Let tp span scale-up domains.")] = False,
    headroom: Headroom = None,
    calibration: Annotated[Optional[Path], typer.Option("--calibration", help="JSON file of per-GPU corrections to the kernel prices (from validate --calibrate).")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Say why #1 beats #2 and what kept other layouts out.")] = False,
    tokens: Tokens = None, gpu_hour_cost: GpuHourCost = None, ckpt_write_gbps: CkptWrite = None, gpu_mtbf_hours: GpuMtbf = None,
    as_json: AsJson = False,
    timings: Annotated[bool, typer.Option(
        "--timings", help="Add the search's wall time (search.seconds) to --json; without it the document depends only on the input.",
    )] = False,
    torchtitan_version: TitanVersionOpt = TitanVersion.V03, torchtitan_model: TitanModelOpt = None,
    megatron_fsdp: MegatronFsdpOpt = MegatronFsdp.MEGATRON,
    time_limit: TimeLimit = None,
) -> None:
    """Search every layout (tp/sp, pp/vpp, dp and sharding, cp, ep/etp, mbs, recompute) and rank the fastest that fit."""
    with _user_errors():
        from cost_models.calibration import DEFAULT
        from planner.files import load_calibration
        from planner.launch.options import LaunchOptions
        from planner.runners import run_plan

        training = _training(
            seq_len=seq_len, global_batch_size=global_batch_size, framework=framework, dtype=dtype,
            fp8_recipe=fp8_recipe, optimizer=optimizer, attention=attention, compile=compile,
            tp_comm_overlap=tp_comm_overlap, attention_backend=attention_backend, moe_dispatch=moe_dispatch,
            moe_load_factor=moe_load_factor, fp8_param_gather=fp8_param_gather, fp8_attention=fp8_attention, grad_reduce_in_bf16=grad_reduce_in_bf16,
            vocab_divisible_by=vocab_divisible_by,
        )
        cal = load_calibration(calibration) if calibration else DEFAULT
        status = None
        if not as_json:
            from rich.console import Console as StatusConsole

            status = StatusConsole(stderr=True).status(f"searching layouts of {model} on {gpus} GPUs…")
            status.start()
        try:
            report = run_plan(
                model, cluster, gpus, training=training, fixes=fix or [], top=top, headroom=headroom,
                allow_cross_node_tp=allow_cross_node_tp, calibration=cal,
                progress=None if status is None else lambda line: status.update(f"searching {model} on {gpus} GPUs: {line}"),
                outlook=_outlook(tokens, gpu_hour_cost, ckpt_write_gbps, gpu_mtbf_hours),
                launch=LaunchOptions(torchtitan_version=torchtitan_version, torchtitan_model=torchtitan_model,
                                     megatron_fsdp=megatron_fsdp),
                time_limit_s=time_limit,
            )
        finally:
            if status is not None:
                status.stop()
    if as_json:
        from planner.render import print_json

        print_json(report.to_json(timings=timings))
    else:
        from rich.console import Console

        from planner.render import render_plan

        render_plan(report, Console(), explain=explain)


@app.command()
@_options_of(estimate, skip={"as_json"} | _OUTLOOK)
def launch(
    model: Model, cluster: ClusterOpt, gpus: Gpus,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write (must be empty unless --force).")],
    rank: Annotated[IntOpt, typer.Option("--rank", help="Without layout flags: launch plan #K of the search (default 1).")] = None,
    fix: Annotated[Optional[list[str]], typer.Option("--fix", help="Without layout flags: pin an axis of the search, e.g. --fix pp=1.")] = None,
    torchtitan_version: TitanVersionOpt = TitanVersion.V03, torchtitan_model: TitanModelOpt = None,
    megatron_fsdp: MegatronFsdpOpt = MegatronFsdp.MEGATRON,
    nodes_file: Annotated[Optional[Path], typer.Option("--nodes-file", help="Host names, one a line; the first hosts the rendezvous.")] = None,
    partition: Annotated[Optional[str], typer.Option("--partition", help="Slurm partition (writes job.sbatch even for one node).")] = None,
    account: Annotated[Optional[str], typer.Option("--account", help="Slurm account.")] = None,
    time: Annotated[Optional[str], typer.Option("--time", help="Slurm time limit, e.g. 04:00:00.")] = None,
    job_name: Annotated[Optional[str], typer.Option("--job-name", help="Slurm job name (default: from the model name).")] = None,
    port: Annotated[int, typer.Option("--port", help="Rendezvous port on the first node.")] = DEFAULT_PORT,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --out directory.")] = False,
    time_limit: Annotated[FloatOpt, typer.Option("--time-limit", help="Without layout flags: seconds the search may run (default 30).")] = None,
    **flags,  # type: ignore[no-untyped-def]
) -> None:
    """Write the files that run one plan: plan.json, README.md, train.sh and the framework's configs (job.sbatch for several nodes)."""
    with _user_errors():
        from cost_models.calibration import DEFAULT
        from planner.files import load_calibration
        from planner.launch.build import LaunchOptions, read_nodes_file, run_launch, write_launch
        from planner.writing import check_dir, lock

        check_dir(out, force=force)
        with lock(out):
            headroom, calibration = flags.pop("headroom"), flags.pop("calibration")
            training, layout = _specs(**flags)
            options = LaunchOptions(
                torchtitan_version=torchtitan_version, torchtitan_model=torchtitan_model, megatron_fsdp=megatron_fsdp,
                hosts=read_nodes_file(nodes_file) if nodes_file else (), partition=partition, account=account, time=time,
                job_name=job_name, port=port,
            )
            cal = load_calibration(calibration) if calibration else DEFAULT
            files = run_launch(model, cluster, gpus, training=training, layout=layout, rank=rank, fixes=fix, options=options,
                               headroom=headroom, calibration=cal, flags=True, time_limit_s=time_limit)
            written = write_launch(files, out, force=force)
    from planner.files import shown

    print(f"wrote {len(written)} files to {shown(out)}: {', '.join(p.name for p in written)}")
    if files.unproven:
        print(f"plan #{files.rank} is not proven the fastest: {files.unproven}", file=sys.stderr)


@app.command()
def validate(
    target: Annotated[str, typer.Argument(help="PLAN_DIR holding plan.json (from planner launch), or MODEL as for estimate.")],
    cluster: Annotated[Optional[str], typer.Option("--cluster", "-c", help="Cluster preset name or cluster spec file (with MODEL).")] = None,
    gpus: Annotated[IntOpt, typer.Option("--gpus", "-g", help="Number of GPUs of the plan (with MODEL).")] = None,
    tp: Tp = None, pp: Pp = None, vpp: Vpp = None, cp: Cp = None, ep: Ep = None, etp: Etp = None, mbs: Mbs = None,
    sp: Sp = None, zero: ZeroOpt = None, dp_shard: DpShard = None, recompute: RecomputeOpt = None,
    recompute_layers: RecomputeLayers = None, schedule: ScheduleOpt = None, pp_first: PpFirst = None, pp_last: PpLast = None,
    account_for_embedding: AccountEmb = None, account_for_loss: AccountLoss = None, pp_layout: PpLayout = None,
    seq_len: SeqLen = None, global_batch_size: GlobalBatch = None, framework: FrameworkOpt = None, dtype: Dtype = None,
    fp8_recipe: Fp8RecipeOpt = None, optimizer: OptimizerOpt = None, attention: AttentionOpt = None, compile: Compile = None, tp_comm_overlap: TpOverlap = None,
    attention_backend: AttnBackendOpt = None, moe_dispatch: MoeDispatchOpt = None, moe_load_factor: MoeLoadOpt = None,
    fp8_param_gather: Fp8ParamsOpt = None, fp8_attention: Fp8AttnOpt = None, grad_reduce_in_bf16: GradBf16 = None, vocab_divisible_by: VocabDivisibleBy = None,
    nproc_per_node: Annotated[IntOpt, typer.Option("--nproc-per-node", help="Ranks to start on this node (default: the plan's GPUs, at most the GPUs or CPU cores present).")] = None,
    steps: Annotated[int, typer.Option("--steps", help="Timed training steps after the warm-up (on GPUs as many again run under the profiler).")] = 10,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed steps first.")] = 3,
    backend: Annotated[Optional[ValidateBackend], typer.Option("--backend", help="nccl (GPUs) or gloo (CPU); default nccl when CUDA is available.")] = None,
    fp32: Annotated[bool, typer.Option("--fp32", help="Compute in fp32 instead of the plan's dtype (bit-for-bit comparisons on CPU).")] = False,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the job, its traces and validate.json.")] = Path("planner-validate"),
    timeout: Annotated[float, typer.Option("--timeout", help="Overall time limit, seconds.")] = 3600.0,
    step_timeout: Annotated[float, typer.Option("--step-timeout", help="Time limit of one training step and of one collective, seconds.")] = 300.0,
    calibrate: Annotated[Optional[Path], typer.Option("--calibrate", help="Fit per-GPU corrections to the kernel prices from the measurements and write them to FILE.")] = None,
    calibration: Annotated[Optional[Path], typer.Option("--calibration", help="JSON file of kernel-price corrections to predict with (and to start a fit from).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Write into a non-empty --out that no earlier validate wrote (only validate's own files are replaced).")] = False,
    as_json: AsJson = False,
) -> None:
    """Run a short profiled torch job that implements the plan (or its largest slice that fits here) and compare it with the prediction."""
    flags = {k: v for k, v in locals().items() if k not in _NOT_SPECS | _VALIDATE_ONLY}
    from rich.console import Console

    with _user_errors():
        from cost_models.calibration import DEFAULT
        from planner.files import load_calibration
        from planner.validate.command import Options, ProgressBar, fault_injection, run_validate

        options = Options(
            steps=steps, warmup=warmup, nproc=nproc_per_node, backend=str(backend) if backend else None, fp32=fp32,
            timeout_s=timeout, step_timeout_s=step_timeout, calibrate=calibrate,
            calibration=load_calibration(calibration) if calibration else DEFAULT, debug=fault_injection(), force=force,
        )
        options.check(out)
        training, layout = _specs(**flags)
        from planner.writing import lock

        with lock(out), ProgressBar(Console(stderr=True)) as bar:
            report = run_validate(target, cluster=cluster, gpus=gpus, training=training, layout=layout, out_dir=out,
                                  options=options, on_progress=bar.update)
    if as_json:
        from planner.render import print_json

        print_json(report.to_json())
    else:
        from planner.validate.command import render

        console = Console()
        if not console.is_terminal:  # pipes default to 80 columns; the comparison table needs ~110
            console = Console(width=max(console.width, 120))
        render(report, console)
    if not report.ok:
        from planner.text import printable

        print(f"error: {printable(report.launch.cause or 'failed')}", file=sys.stderr)
        raise typer.Exit(128 + report.launch.signal if report.launch.signal else 1)


_VALIDATE_ONLY = {"target", "nproc_per_node", "steps", "warmup", "backend", "fp32", "out", "timeout", "step_timeout", "calibrate", "force"}


@app.command()
def sweep(
    model: Model, cluster: ClusterOpt,
    gpus: Annotated[str, typer.Option("--gpus", help="GPU counts: LO..HI (the powers of two between) or a list 64,128,256.")],
    seq_len: SeqLen = None,
    global_batch_size: Annotated[IntOpt, typer.Option("--global-batch-size", help="Sequences per step (default: 4M tokens / seq len).")] = None,
    framework: FrameworkOpt = None, dtype: Dtype = None, fp8_recipe: Fp8RecipeOpt = None, optimizer: OptimizerOpt = None,
    attention: AttentionOpt = None, compile: Compile = None, tp_comm_overlap: TpOverlap = None,
    attention_backend: AttnBackendOpt = None, moe_dispatch: MoeDispatchOpt = None, moe_load_factor: MoeLoadOpt = None,
    fp8_param_gather: Fp8ParamsOpt = None, fp8_attention: Fp8AttnOpt = None, grad_reduce_in_bf16: GradBf16 = None, vocab_divisible_by: VocabDivisibleBy = None,
    fix: Annotated[Optional[list[str]], typer.Option("--fix", help="Pin an axis at every count, e.g. --fix pp=1.")] = None,
    allow_cross_node_tp: Annotated[bool, typer.Option("--allow-cross-node-tp", help="Let tp span scale-up domains.")] = False,
    headroom: Headroom = None,
    as_json: AsJson = False,
    png: Annotated[Optional[Path], typer.Option("--png", help="Also draw the sweep into this PNG (needs the plots extra).")] = None,
    tokens: Tokens = None, gpu_hour_cost: GpuHourCost = None, ckpt_write_gbps: CkptWrite = None, gpu_mtbf_hours: GpuMtbf = None,
    time_limit: TimeLimit = None,
) -> None:
    """The best plan at each GPU count: tokens/s, tokens/s/GPU, MFU, layout, and strong-scaling efficiency."""
    with _user_errors():
        from planner.sweep import parse_gpus, run_sweep, scaling_limit

        counts = parse_gpus(gpus)
        if png is not None:
            from planner.plots import check_png

            check_png(png)
        training = _training(
            seq_len=seq_len, global_batch_size=global_batch_size, framework=framework, dtype=dtype,
            fp8_recipe=fp8_recipe, optimizer=optimizer, attention=attention, compile=compile,
            tp_comm_overlap=tp_comm_overlap, attention_backend=attention_backend, moe_dispatch=moe_dispatch,
            moe_load_factor=moe_load_factor, fp8_param_gather=fp8_param_gather, fp8_attention=fp8_attention, grad_reduce_in_bf16=grad_reduce_in_bf16,
            vocab_divisible_by=vocab_divisible_by,
        )
        rows = run_sweep(model, cluster, counts, training=training, fixes=fix or [], headroom=headroom,
                         allow_cross_node_tp=allow_cross_node_tp,
                         outlook=_outlook(tokens, gpu_hour_cost, ckpt_write_gbps, gpu_mtbf_hours), time_limit_s=time_limit)
        if png is not None:
            from planner.plots import sweep_png

            sweep_png(rows, png, title=f"{model} on {cluster}: best plan per GPU count")
    if as_json:
        from planner.render import print_json

        print_json({"sweep": [r.to_json() for r in rows], "scaling_limit": scaling_limit(rows).to_json()})
    else:
        from rich.console import Console

        from planner.render import render_sweep

        render_sweep(rows, Console())


@app.command()
def presets(as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False) -> None:
    """List the model, GPU and cluster presets."""
    with _user_errors():
        from planner import presets as p

        models, gpus, clusters = p.models(), p.gpus(), p.clusters()
    if as_json:
        from planner.render import presets_json, print_json

        print_json(presets_json(models, gpus, clusters))
    else:
        from rich.console import Console

        from planner.render import render_presets

        console = Console()
        if not console.is_terminal:  # pipes default to 80 columns; the model table needs ~85
            console = Console(width=max(console.width, 100))
        render_presets(models, gpus, clusters, console)


def main() -> None:
    """Console entry point: usage errors (unknown option, bad value) are one line and exit code 2."""
    from typer._click.exceptions import ClickException, NoArgsIsHelpError

    from planner.text import fit_streams, printable

    fit_streams()
    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as e:
        print(e.format_message(), file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except ClickException as e:
        print(f"error: {printable(e.format_message().replace('Value error, ', ''))}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
