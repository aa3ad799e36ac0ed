"""What PyTorch's caching allocator reserves on nanotron's pipeline rank 0, replayed tensor by tensor.

nanotron's bench figure is the reserved counter of global rank 0 (benchmarks/memory_accuracy.py), which
counts every segment the caching allocator has taken from the device since the training loop's
empty_cache (huggingface/nanotron@c2528430 src/nanotron/trainer.py:443-445), not the live tensors. This
script replays rank 0's allocations and frees through a model of the allocator's large pool and prints
the reserved and the allocated peaks beside the figure and beside cost_models.memory's prediction, for
the rows with a pipeline (the 1F1B engine), the decoder layer as nanotron's Llama runs it. It is an
exploration tool: the cost model does not use it. The model of the allocator is checked against the
allocator itself: benchmarks/gpu_allocator_replay.py sends the same requests to torch 2.11's caching
allocator on an H200, and its reserved bytes equal this replay's on all 16 rows to 0.1 GiB
(benchmarks/data/measured/h200-allocator-replay-2026-11-27.json). What the replay leaves open is the
order of the requests (approximated below) and the memory outside the allocator, not the allocator.

The allocator (pytorch/pytorch@001074d2 c10/cuda/CUDACachingAllocator.cpp, its header comment and
constants; the same rules in the torch 2.1 the sweep's environment names, run_multinode.sh on nanotron's
nouamane/bench2 branch): sizes round up to 512 bytes; requests of at most 1 MiB go to the small pool (left
out here); a request takes the smallest cached free block that fits (ties: lowest address) and splits it
when more than 1 MiB would remain; with none, a new segment of the request rounded up to 2 MiB (20 MiB
for requests under 10 MiB); a freed block merges with free neighbours of its own segment; segments are
never merged and never released without empty_cache. `capacity` optionally models the retry after a
failed cudaMalloc (release of the cached unsplit segments); the device memory left to the allocator is
not published for these runs, so it is off by default. What it would take: torch reads an H100 80GB
HBM3's total as 79.11 GiB (its out-of-memory message, github.com/vllm-project/vllm/issues/27508), and the
8p86b dp16 and dp32 pp2 rows replay to 75.5 and 74.4 GiB unbounded but to 60.0 and 58.2 GiB (the
figure's 61.1 and 59.1) at any capacity from about 62 GiB up to just under those, so at least 3.6 and
4.7 GiB outside the allocator. Their rank 0 holds the CUDA context and NCCL communicators on the default
group (the barriers of huggingface/nanotron@c2528430 src/nanotron/parallel/context.py:67-135), on
nanotron's world group (all_gather_object, parallel/tied_parameters.py:92-93, called from
trainer.py:981), on its data-parallel group and on its pipeline pair. torch 2.1's cu121 wheels pin
nvidia-nccl-cu12 2.18.1, which on NVSwitch nodes with multicast support gives each communicator with
more than 2 GPUs on the node NVLink SHARP buffers of 16 channels x 2 x (4 MiB + 2 MiB) x nHeads at its
init (NVIDIA/nccl@d97a32fa, v2.18.1-1, src/transport/nvls.cc:228-239, 305-315; init.cc:1045-1046):
1.5 GiB with nHeads 8, which an intra-node communicator always has (graph/search.cc:821-823) but a
multi-node one gets from the topology search; whether the sweep's nodes reported multicast support is
not published. So the sourced figure lies
between about 1.5 GiB (no NVLink SHARP) and 6 GiB (three communicators with 8 heads), across the
threshold. The rest of the sweep (benchmarks/nanotron_sweep_memory.py) bounds it from the other side:
on the same cluster rank 0's reserved counter read 76.9 GiB (3.57B, 2 nodes, dp4 tp1 pp4, mbs 4,
ZeRO-1) and 77.1 GiB (8.86B, 4 nodes, dp4 tp1 pp8, mbs 2, ZeRO-1), so at most 2.2 and 2.0 GiB sat
outside the allocator there, although rank 0 there also holds a world communicator over the 8 GPUs of
its node and a data-parallel one over 4 (replayed, both run out of memory below a 76 GiB capacity and
read 77.2 and 77.3 GiB at 77.4). One capacity set by the communicators cannot give both these and the
8p86b pp2 rows; what differs on those rows (a data-parallel communicator across nodes, 8 GPUs on each)
has its NVLink SHARP heads from the topology search, which no source gives.
The same copies without a pipeline do not fit that bound: the 80B dp32 tp16 pp1 row
replays (--zero1-without-pipeline: no LM head or loss, so from below) to 62.5 GiB against the
figure's 53.5, which a capacity would cut only below 62.4 GiB, 16.7 GiB outside the allocator.

Rank 0's tensors, bf16 unless noted, t tokens of the micro-batch, h hidden, f ffn (src/nanotron at
c2528430): the persistent bf16 weights, fp32 gradient buffer of every parameter and fp32 master copy of
the rank's ZeRO-1 shard (optim/gradient_accumulator.py:73-102, 157-202); per decoder layer the forward
of models/llama.py:717-734 (RMSNorm outputs, the qkv projection and its [3, b, s, heads, d] permuted copy,
the k/v concatenation and its permuted copy, flash attention's output, the projections, residual sums,
[gate|up], silu(gate) and the product: llama.py:194-201, 444-474, 650-692; at tp > 1 with sequence
parallelism the two persistent gather buffers, each row-parallel output and column-parallel input
gradient made whole and then reduce-scattered into a new shard, the vocabulary-parallel embedding's
whole lookup and masked product, parallel/tensor_parallel/functional.py:153-156, 286-288, 453-470,
491-493, nn.py:277-299, parallel/utils.py:14-28); the backward in the reverse
order with each weight's bf16 gradient kept until the backward of the micro-batch ends, then freed
parameter by parameter (gradient_accumulator.py:204-223); the 1F1B schedule of rank 0, pp - 1 warm-up
forwards, the stage output freed once sent, one received gradient per backward
(parallel/pipeline_parallel/engine.py:226-330, p2p.py:317-356); at the optimizer step Adam's two fp32
moments per parameter shard, made at the first step, and ZeRO-1's three flat bf16 copies of the
parameter all-gather (optim/zero.py:217-251, distributed.py:195-206, and the flatten of
ProcessGroupNCCL::allgather, pytorch/pytorch@0007e752). The order of the frees inside one operation's
backward is autograd's, approximated; a block freed while a collective on the NCCL stream still reads
it is taken as free at once.

Run: python benchmarks/nanotron_allocator_replay.py [--iterations 3] [--capacity-gib N] [--zero1-without-pipeline]
"""

from __future__ import annotations

import argparse
import bisect
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cost_models.enums import Zero
from cost_models.units import GiB, MiB

sys.path.insert(0, str(Path(__file__).parent))
from memory_accuracy import rows  # noqa: E402
from published import load, nanotron_pp_layers  # noqa: E402

MIN_BLOCK_BYTES = 512  # kMinBlockSize
SMALL_BYTES = MiB  # kSmallSize: the largest small-pool request
MIN_LARGE_ALLOC_BYTES = 10 * MiB  # kMinLargeAlloc
LARGE_BUFFER_BYTES = 20 * MiB  # kLargeBuffer: the segment of a 1-10 MiB request
ROUND_LARGE_BYTES = 2 * MiB  # kRoundLarge
BF16, FP32 = 2, 4


@dataclass(eq=False)
class Block:
    addr: int
    size: int
    segment: int
    free: bool = True
    prev: Block | None = None
    next: Block | None = None


@dataclass
class CachingAllocator:
    capacity_bytes: int | None = None
    reserved: int = 0
    allocated: int = 0
    peak_reserved: int = 0
    peak_allocated: int = 0
    releases: int = 0
    _free: list[tuple[int, int, int]] = field(default_factory=list)  # (size, addr, id) of free blocks
    _blocks: dict[int, Block] = field(default_factory=dict)
    _segments: dict[int, Block] = field(default_factory=dict)  # first block of each segment
    _next_addr: int = 0

    def _add_free(self, b: Block) -> None:
        bisect.insort(self._free, (b.size, b.addr, id(b)))
        self._blocks[id(b)] = b

    def _remove_free(self, b: Block) -> None:
        self._free.pop(bisect.bisect_left(self._free, (b.size, b.addr, id(b))))

    def _new_segment(self, size: int) -> None:
        seg_bytes = (LARGE_BUFFER_BYTES if size < MIN_LARGE_ALLOC_BYTES
                     else -(-size // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES)
        if self.capacity_bytes is not None and self.reserved + seg_bytes > self.capacity_bytes:
            self.releases += 1
            for seg, first in list(self._segments.items()):
                if first.free and first.next is None:  # a whole cached segment
                    self._remove_free(first)
                    del self._segments[seg]
                    self.reserved -= first.size
            if self.reserved + seg_bytes > self.capacity_bytes:
                raise MemoryError(f"{self.reserved + seg_bytes} bytes above the capacity")
        b = Block(self._next_addr, seg_bytes, segment=self._next_addr)
        self._next_addr += seg_bytes
        self._segments[b.segment] = b
        self._add_free(b)
        self.reserved += seg_bytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def malloc(self, nbytes: int) -> Block | None:
        if nbytes <= SMALL_BYTES:
            return None
        size = -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
        i = bisect.bisect_left(self._free, (size, -1, -1))
        if i == len(self._free):
            self._new_segment(size)
            i = bisect.bisect_left(self._free, (size, -1, -1))
        b = self._blocks[self._free.pop(i)[2]]
        if b.size - size > SMALL_BYTES:
            rest = Block(b.addr + size, b.size - size, b.segment, prev=b, next=b.next)
            if b.next is not None:
                b.next.prev = rest
            b.next, b.size = rest, size
            self._add_free(rest)
        b.free = False
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return b

    def release(self, b: Block | None) -> None:
        if b is None:
            return
        b.free = True
        self.allocated -= b.size
        for other in (b.next, b.prev):
            if other is not None and other.free:
                self._remove_free(other)
                first, second = (b, other) if other is b.next else (other, b)
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.prev = first
                if second is self._segments.get(second.segment):
                    self._segments[second.segment] = first
                b = first
        self._add_free(b)


def replay(*, vocab: int, h: int, f: int, layers: int, tokens: int, pp: int, microbatches: int, dp: int, tp: int = 1,
           zero1: bool, iterations: int = 3, capacity_bytes: int | None = None, allocator=None):  # type: ignore[no-untyped-def]
    """Rank 0 of a nanotron pipeline (embedding and `layers` decoder layers), `iterations` steps, through
    `allocator` (anything with malloc(nbytes) -> handle and release(handle); default the model above,
    bounded by `capacity_bytes`)."""
    if allocator is not None and capacity_bytes is not None:
        raise ValueError("replay: capacity_bytes bounds the modelled allocator only; an allocator passed in "
                         "brings its own capacity (pass one or the other)")
    a = CachingAllocator(capacity_bytes) if allocator is None else allocator
    params = [vocab * h // tp] + [n // tp for _ in range(layers) for n in (3 * h * h, h * h, 2 * f * h, h * f)]
    total = sum(params)
    shard = dp if zero1 else 1
    for n in params:
        a.malloc(BF16 * n)
    a.malloc(FP32 * total)  # the fp32 gradient buffer of every parameter
    a.malloc(FP32 * total // shard)  # the fp32 master copy of the shard
    # th: a sequence-sharded [t/tp, h] or head-sharded [t, h/tp] tensor; whole: [t, h]
    th, tf, whole = BF16 * tokens * h // tp, BF16 * tokens * f // tp, BF16 * tokens * h
    if tp > 1:
        a.malloc(whole)  # the "allgather" buffer, never freed
        a.malloc(whole)  # the "allgather2" buffer

    def scattered() -> Block | None:
        """A row-parallel output (or a column-parallel input gradient): whole, then reduce-scattered."""
        if tp == 1:
            return a.malloc(th)
        w = a.malloc(whole)
        out = a.malloc(th)
        a.release(w)
        return out

    def embedding(nbytes: int) -> Block | None:
        """A tensor of the vocabulary-parallel embedding, made at tp > 1 between its two whole tensors."""
        if tp == 1:
            return a.malloc(nbytes)
        first = a.malloc(whole)
        second = a.malloc(whole)
        a.release(first)
        out = a.malloc(nbytes)
        a.release(second)
        return out

    def forward() -> tuple[list[dict[str, Block | None]], Block | None]:
        saved = []
        x = embedding(th)  # the embedding's output (at tp > 1 the lookup and its masked product, reduce-scattered)
        for _ in range(layers):
            n1 = a.malloc(th)
            qkv = a.malloc(3 * th)
            c3 = a.malloc(3 * th)  # [3, b, s, heads, d] copy; q is rotated in place in it and kept
            a.release(qkv)
            cat = a.malloc(2 * th)
            kv = a.malloc(2 * th)
            a.release(cat)
            o = a.malloc(th)
            proj = scattered()
            r1 = a.malloc(th)
            a.release(proj)
            n2 = a.malloc(th)
            gate_up = a.malloc(2 * tf)
            act = a.malloc(tf)
            prod = a.malloc(tf)
            down = scattered()
            r2 = a.malloc(th)
            a.release(down)
            saved.append(dict(x=x, n1=n1, c3=c3, kv=kv, o=o, r1=r1, n2=n2, gate_up=gate_up, act=act, prod=prod))
            x = r2
        return saved, x

    def backward(saved: list[dict[str, Block | None]]) -> None:
        grads = []

        def into_residual(g_in: Block | None, weight_grad_bytes: int, normed: Block | None, g_residual: Block | None,
                          residual: Block | None) -> Block | None:
            """The backward of a column-parallel projection's input (`g_in` its output gradient, `normed` its saved
            input), of the RMSNorm before it and of the residual sum around both: the residual stream's gradient."""
            g_normed = scattered()
            grads.append(a.malloc(weight_grad_bytes))
            a.release(g_in)
            a.release(normed)
            g_norm = a.malloc(th)
            a.release(g_normed)
            g_out = a.malloc(th)
            for t in (g_norm, g_residual, residual):
                a.release(t)
            return g_out

        g = a.malloc(th)  # received from rank 1
        for s in reversed(saved):
            g_prod = a.malloc(tf)
            grads.append(a.malloc(BF16 * h * f // tp))
            a.release(s["prod"])
            g_act, g_up = a.malloc(tf), a.malloc(tf)
            a.release(g_prod)
            a.release(s["act"])
            g_gate = a.malloc(tf)
            a.release(g_act)
            g_gate_up = a.malloc(2 * tf)
            for t in (g_gate, g_up, s["gate_up"]):
                a.release(t)
            g_r1 = into_residual(g_gate_up, BF16 * 2 * f * h // tp, s["n2"], g, s["r1"])
            g_o = a.malloc(th)
            grads.append(a.malloc(BF16 * h * h // tp))
            dq, dk, dv = a.malloc(th), a.malloc(th), a.malloc(th)
            a.release(a.malloc(FP32 * tokens * h // tp))  # flash attention's fp32 dq accumulator
            a.release(g_o)
            a.release(s["o"])
            g_kv = a.malloc(2 * th)
            for t in (dk, dv, s["kv"]):
                a.release(t)
            g_c3 = a.malloc(3 * th)
            for t in (dq, g_kv, s["c3"]):
                a.release(t)
            g_qkv = a.malloc(3 * th)
            a.release(g_c3)
            g = into_residual(g_qkv, BF16 * 3 * h * h // tp, s["n1"], g_r1, s["x"])
        # the embedding shard's dense gradient (at tp > 1 the all-gathered gradient and the masked product's)
        grads.append(embedding(BF16 * vocab * h // tp))
        a.release(g)
        for t in reversed(grads):  # the accumulator's loop, embedding first
            a.release(t)

    moments = False
    for _ in range(iterations):
        inflight = []
        for k in range(microbatches):
            saved, out = forward()
            inflight.append(saved)
            a.release(out)  # sent to rank 1
            if k >= pp - 1:
                backward(inflight.pop(0))
        for saved in inflight:
            backward(saved)
        if not moments:
            for n in params:
                a.malloc(FP32 * n // shard)
                a.malloc(FP32 * n // shard)
            moments = True
        if zero1 and dp > 1:
            flats = [a.malloc(BF16 * total // dp) for _ in range(dp + 1)] + [a.malloc(BF16 * total)]
            for t in flats:
                a.release(t)
    return a


def replay_run(run, *, iterations: int = 3, capacity_bytes: int | None = None, allocator=None):  # type: ignore[no-untyped-def]
    """`replay` of a published run (benchmarks/published.py) of nanotron's."""
    job, m = run.job(), run.model
    return replay(vocab=m.vocab_size, h=m.hidden_size, f=m.ffn_hidden_size, layers=nanotron_pp_layers(m, job.layout.pp)[0],
                  tokens=job.layout.mbs * job.training.seq_len, pp=job.layout.pp, microbatches=job.num_microbatches,
                  dp=job.dp, tp=job.layout.tp, zero1=job.zero is Zero.OPTIMIZER, iterations=iterations,
                  capacity_bytes=capacity_bytes, allocator=allocator)


def pipeline_runs(*, zero1_without_pipeline: bool = False):  # type: ignore[no-untyped-def]
    """The published nanotron runs this replay covers, each with its row of benchmarks/memory_accuracy.py
    (the measured and the predicted GiB): those with a pipeline and, with `zero1_without_pipeline`, the
    ZeRO-1 runs with pp = 1."""
    predicted = {r.id: r for r in rows("nanotron_ultrascale")}
    for run in load()[0]:
        if run.id not in predicted:
            continue
        if run.layout.pp == 1 and not (zero1_without_pipeline and run.job().zero is Zero.OPTIMIZER):
            continue
        yield run, predicted[run.id]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--capacity-gib", type=float, default=None)
    parser.add_argument("--zero1-without-pipeline", action="store_true",
                        help="also the ZeRO-1 rows with pp = 1, replayed without their LM head and loss (from below)")
    args = parser.parse_args()
    cap = None if args.capacity_gib is None else int(args.capacity_gib * GiB)
    print("| run | measured GiB | cost model GiB | replayed reserved GiB | error | replayed allocated GiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for run, row in pipeline_runs(zero1_without_pipeline=args.zero1_without_pipeline):
        try:
            a = replay_run(run, iterations=args.iterations, capacity_bytes=cap)
        except MemoryError:
            print(f"| {run.id} | {row.measured_gib:.1f} | {row.predicted_gib:.1f} | out of memory | | |")
            continue
        reserved = a.reserved / GiB  # what max_memory_reserved reads after the reset at iteration 3
        print(f"| {run.id} | {row.measured_gib:.1f} | {row.predicted_gib:.1f} | {reserved:.1f} | "
              f"{reserved / row.measured_gib - 1:+.1%} | {a.peak_allocated / GiB:.1f} |")


if __name__ == "__main__":
    main()
