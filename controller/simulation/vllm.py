"""A vLLM replica at token level: continuous batching over a paged KV cache.

What it models, after vLLM's V1 scheduler (docs/design/v1 "scheduler", "paged attention"):

- Requests wait FCFS; the head is admitted when a batch slot is free (``max_num_seqs``) and the
  pool has the blocks its prompt needs (``block_size`` tokens per block). A head that does not
  fit blocks the queue behind it, as FCFS does.
- Every iteration gives each running sequence one token, so a sequence holds
  ``ceil((prompt + generated) / block_size)`` blocks and grows until its output is done.
  KV-cache use (``vllm:kv_cache_usage_perc``) is blocks held by running sequences / the pool.
- Iterations get slower as the batch grows (inter-token latency ``itl_base + itl_per_seq × n``),
  and prompt tokens being prefilled take GPU time from decoding (``prefill_rate`` tokens/s).
- When decode growth overflows the pool, the newest running sequence is preempted by recompute:
  its blocks are freed and it goes back to the head of the queue, to be prefilled again
  (prompt + what it had generated) before it continues.
- TTFT = time waiting + time for the prefill backlog ahead of it and its own prompt; end to end
  = arrival to last token.

It is stepped in slices of ``dt`` seconds; within a slice the batch is constant. The bookkeeping
is O(1) per slice plus O(log n) per request: the replica keeps a token clock (tokens every
running sequence has received), and each sequence's length is its start length plus how far the
clock moved since it was admitted.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from controller.fakes.pages import CumulativeHistogram


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One vLLM server. The defaults are an 8B model on a 24 GB GPU: 32k tokens of KV."""

    num_gpu_blocks: int = 2048
    block_size: int = 16
    max_num_seqs: int = 128
    itl_base: float = 0.012  # seconds per decode iteration with an empty batch
    itl_per_seq: float = 0.0002  # and what each running sequence adds
    prefill_rate: float = 8000.0  # prompt tokens per second


@dataclass(slots=True)
class Request:
    arrival: float
    prompt: int
    output: int
    routed: bool = True  # sent by the weights (False: local traffic the weights cannot move)
    ident: int = 0
    generated: int = 0  # tokens it had generated when last preempted (recomputed on return)
    start_clock: float = 0.0
    start_tokens: int = 0
    epoch: int = 0
    first_token: bool = False


@dataclass
class Replica:
    spec: ReplicaSpec
    waiting: deque[Request] = field(default_factory=deque)
    running: dict[int, Request] = field(default_factory=dict)  # in admission order
    finish: list[tuple[float, int, int]] = field(default_factory=list)  # (clock, ident, epoch)
    clock: float = 0.0
    held: float = 0.0  # Σ (start_tokens − start_clock) over running sequences
    backlog: float = 0.0  # prompt tokens admitted but not yet prefilled
    preemptions: int = 0
    completed: int = 0
    first_tokens: list[float] = field(default_factory=list)  # every TTFT, for percentiles
    e2e: CumulativeHistogram = field(default_factory=CumulativeHistogram)

    def blocks_used(self) -> float:
        n = len(self.running)
        # half a block of rounding per sequence, on average
        return (self.held + n * self.clock) / self.spec.block_size + 0.5 * n

    @property
    def kv(self) -> float:
        return min(1.0, self.blocks_used() / self.spec.num_gpu_blocks)

    def offer(self, request: Request) -> None:
        self.waiting.append(request)

    def step(self, now: float, dt: float, done: list[tuple[Request, float]]) -> None:
        """Advance ``dt`` seconds from ``now``. Appends (request, end-to-end seconds) for each
        request that finished; TTFTs are kept in ``first_tokens`` as requests are admitted."""
        spec = self.spec
        self._admit(now)
        prefill = min(dt, self.backlog / spec.prefill_rate)
        self.backlog -= prefill * spec.prefill_rate
        n = len(self.running)
        if n:
            self.clock += (dt - prefill) / (spec.itl_base + spec.itl_per_seq * n)
        end = now + dt
        finish, running = self.finish, self.running
        while finish and finish[0][0] <= self.clock:
            _, ident, epoch = heapq.heappop(finish)
            request = running.get(ident)
            if request is None or request.epoch != epoch:
                continue  # preempted since: a stale entry
            del running[ident]
            self.held -= request.start_tokens - request.start_clock
            self.completed += 1
            latency = end - request.arrival
            self.e2e.observe(latency)
            done.append((request, latency))
        self._preempt()

    def _admit(self, now: float) -> None:
        spec = self.spec
        waiting, running = self.waiting, self.running
        free = spec.num_gpu_blocks - self.blocks_used()
        while waiting and len(running) < spec.max_num_seqs:
            head = waiting[0]
            tokens = head.prompt + head.generated
            need = math.ceil(tokens / spec.block_size) + 1
            if need > free:
                break
            waiting.popleft()
            free -= need
            head.start_tokens, head.start_clock = tokens, self.clock
            head.epoch += 1
            running[head.ident] = head
            self.held += tokens - self.clock
            self.backlog += tokens
            heapq.heappush(
                self.finish, (self.clock + head.output - head.generated, head.ident, head.epoch)
            )
            if not head.first_token:
                head.first_token = True
                wait = now - head.arrival + self.backlog / spec.prefill_rate + spec.itl_base
                self.first_tokens.append(wait)

    def _preempt(self) -> None:
        running = self.running
        while len(running) > 1 and self.blocks_used() > self.spec.num_gpu_blocks:
            ident = next(reversed(running))
            victim = running.pop(ident)
            self.held -= victim.start_tokens - victim.start_clock
            victim.generated += int(self.clock - victim.start_clock)
            self.preemptions += 1
            self.waiting.appendleft(victim)

    def drop_all(self) -> int:
        """The server died: everything in it is lost. Returns how many requests."""
        lost = len(self.running) + len(self.waiting)
        self.running.clear()
        self.waiting.clear()
        self.finish.clear()
        self.held = self.backlog = 0.0
        return lost
