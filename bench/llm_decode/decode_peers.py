#!/usr/bin/env python3
"""The Python peers of the LLM decode benchmark (examples/llm_decode): greedy
decoding of the same Llama model from the same weights directory (written by
`llm_decode --write-weights DIR`), fp16 on CUDA, one process, timed per step.

Peers (--peers, in this order):
  eager        examples/llm_decode/llama.py's decode step over its static KV
               cache, called from a Python loop
  cuda_graphs  the same step captured with torch.cuda.CUDAGraph, one graph per
               (batch, context bucket), all in one pool (graph_pool_handle),
               captured largest first at start-up, greedy argmax, the next
               token and position updated inside the graph: the hand-written
               vLLM-style loop, one replay() per step
  compile      the same step under torch.compile(mode="reduce-overhead",
               dynamic=False): one compiled shape per (batch, context bucket),
               torch.compiler.cudagraph_mark_step_begin() before each step;
               the first warm-up pass (compilation and graph recording) is
               reported as compile_s, apart from the timing; --compile-budget-s
               bounds it
  hf_eager     transformers' LlamaForCausalLM.generate, greedy, DynamicCache
  compile_max_autotune  the same under mode="max-autotune" (CUDA graphs too,
               and each product's kernel chosen by benchmarking Triton and
               cuBLAS): torch.compile's best decode settings are one of the two,
               and the summary compares C++ against the faster
  hf_static    the same with cache_implementation="static" (generate compiles
               its decode forward itself with torch.compile reduce-overhead:
               what users run; nothing is compiled by hand on top of it)
The Hugging Face peers use attn_implementation --hf-attn (default "sdpa", the
transformers default and its fastest built-in path; "eager" is the same math
as llama.py and is what scripts/llm_decode_compare.py checks). Their config has
no eos token and min_new_tokens = max_new_tokens, so every call makes exactly
--new-tokens tokens (checked).

Method. Every row of a batch has a --prompt-len token prompt (random tokens,
--seed) and makes --new-tokens tokens: the first from the prefill, then
new_tokens - 1 decode steps (positions prompt_len .. prompt_len + new_tokens - 2).
  eager, cuda_graphs, compile: the prompts are prefilled once (eagerly, not
    timed); a timed run resets the rows' positions and tokens, then
    torch.cuda.synchronize(), time.perf_counter(), the new_tokens - 1 steps,
    torch.cuda.synchronize(), time.perf_counter(). Each step reads the cache up
    to the smallest --context-buckets entry above its position; all three run
    the same step on the same buckets. ms_per_step = run time / steps.
  hf_eager, hf_static: generate() cannot be split, so the steady-state step is
    (T(max_new_tokens=N) - T(max_new_tokens=1)) / (N - 1), with T the median
    over --repeats of synchronize / perf_counter around one generate call (the
    N = 1 call is the prefill plus generate's own setup; the static cache is
    sized prompt_len + N in both calls so that nothing recompiles).
  Warm-up runs are never timed; ms_per_step is the median over --repeats
  timed runs; tokens_per_s = batch * 1000 / ms_per_step.
  token_agreement_vs_eager: the fraction of the batch's generated tokens equal
  to the eager peer's (fp16: the fused kernels of torch.compile and sdpa may
  round differently and flip a near-tie; this is a sanity check, not a test).

Every peer (and every batch within one) runs inside try/except: a failure is
recorded with its message and the rest continues. --budget-s bounds the whole
run: once spent, what is left is recorded as skipped (a timer also interrupts
a peer that overruns it).

Output JSON (printed on stdout, also written to --json), schema
"replay.llm_decode.peers/1":
  {"schema", "complete": bool (everything asked for was measured),
   "notes": [str] (skips, budget),
   "environment": {"python", "torch", "transformers" (or null), "device", "cuda"},
   "model": {"weights", "config" (config.json), "dtype", "parameters"},
   "settings": {"batch_sizes", "prompt_len", "new_tokens", "steps", "repeats",
                "context_buckets", "peers", "hf_attn_implementation", "budget_s",
                "compile_budget_s", "seed", "smoke"},
   "method": {"static_cache_peers": str, "hf_peers": str},
   "peers": {NAME: {"label", "status": "ok" | "partial" | "failed" | "skipped",
                    "error": str or null, "setup_s": float or null,
                    "details": {...} (cuda_graphs: graphs, capture_s; compile:
                               graph_breaks, cudagraph_skips, recompile_limit),
                    "results": [{"batch", "status": "ok" | "failed" | "skipped",
                                 "error", "steps", "ms_per_step", "tokens_per_s",
                                 "samples_ms_per_step" (static-cache peers),
                                 "generate_ms", "prefill_ms", "samples_generate_ms",
                                 "samples_prefill_ms" (HF peers),
                                 "warmup_s", "compile_s" (compile, hf_static),
                                 "token_agreement_vs_eager"}]}},
   "elapsed_s": float}

    python3 bench/llm_decode/decode_peers.py --weights DIR [--json OUT]
        [--batch-sizes 1,8,32,64] [--prompt-len 32] [--new-tokens 128] [--repeats 5]
        [--context-buckets 64,128,256,512,1024] [--peers eager,cuda_graphs,compile,compile_max_autotune,hf_eager,hf_static]
        [--budget-s 540] [--compile-budget-s 300] [--hf-attn sdpa] [--device cuda]
    python3 bench/llm_decode/decode_peers.py --smoke [--weights DIR]
        (a tiny random model unless --weights; batches 1,2, prompt 8, 12 new
         tokens, buckets 16,32,64, 2 repeats: every peer runs, in about a minute)
"""
import argparse
import contextlib
import gc
import json
import math
import pathlib
import platform
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "llm_decode"))

import torch  # noqa: E402

import llama  # noqa: E402

SCHEMA = "replay.llm_decode.peers/1"
PEERS = {
    "eager": "llama.py step, Python loop (eager)",
    "cuda_graphs": "llama.py step, torch.cuda.CUDAGraph per (batch, context bucket), shared pool",
    "compile": "llama.py step, torch.compile(mode=reduce-overhead, dynamic=False)",
    "compile_max_autotune": "llama.py step, torch.compile(mode=max-autotune, dynamic=False)",
    "hf_eager": "transformers generate, DynamicCache",
    "hf_static": "transformers generate, cache_implementation=static (compiles itself)",
}


class OutOfTime(BaseException):
    """A time budget ran out; `budget` says which ("run" or "compile"). A
    BaseException, like KeyboardInterrupt, so that the `except Exception` of
    the code it interrupts (compilers catch and log broadly) lets it through."""

    def __init__(self, budget, what):
        super().__init__(f"the {budget} time budget ran out {what}")
        self.budget = budget


_deadlines = []  # (perf_counter time, budget name), innermost last


def _arm():
    at, _ = min(_deadlines)
    # Fires again every second until disarmed, in case a fire lands where
    # nothing can raise (a signal handler runs between Python bytecodes).
    signal.setitimer(signal.ITIMER_REAL, max(at - time.perf_counter(), 1e-3), 1.0)


def _expire(signum, frame):
    at, budget = min(_deadlines)
    raise OutOfTime(budget, "while running")


@contextlib.contextmanager
def deadline(at, budget="run"):
    """Raises OutOfTime in the main thread once time.perf_counter() passes
    `at` (or an enclosing deadline's time, if earlier), wherever the peer is:
    the timer interrupts Python code, which is most of what could run away
    (compilation)."""
    if at <= time.perf_counter():
        raise OutOfTime(budget, "before starting")
    if not _deadlines:
        deadline.previous_handler = signal.signal(signal.SIGALRM, _expire)
    _deadlines.append((at, budget))
    _arm()
    try:
        yield
    finally:
        _deadlines.pop()
        if _deadlines:
            _arm()
        else:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, deadline.previous_handler)


def message_of(exc):
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 2000 else text[:2000] + "..."


def parse_list(text):
    return [int(v) for v in text.split(",") if v.strip()]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", help="weights directory (config.json + weights.pt)")
    parser.add_argument("--json", help="also write the JSON here")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--batch-sizes", type=parse_list)
    parser.add_argument("--prompt-len", type=int)
    parser.add_argument("--new-tokens", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--context-buckets", type=parse_list,
                        help="ascending; capped at max_len, which is always the last bucket")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--budget-s", type=float, default=540.0, help="the whole run ends within about this")
    parser.add_argument("--compile-budget-s", type=float, default=300.0,
                        help="time the compile peer may spend, compilation included")
    parser.add_argument("--hf-attn", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="a tiny run of every peer (see above)")
    args = parser.parse_args(argv)
    defaults = dict(batch_sizes=[1, 8, 32, 64], prompt_len=32, new_tokens=128, repeats=5,
                    context_buckets=[64, 128, 256, 512, 1024])
    if args.smoke:
        defaults = dict(batch_sizes=[1, 2], prompt_len=8, new_tokens=12, repeats=2, context_buckets=[16, 32, 64])
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.batch_sizes = list(dict.fromkeys(args.batch_sizes))
    args.peers = list(dict.fromkeys(p for p in args.peers.split(",") if p))
    unknown = [p for p in args.peers if p not in PEERS]
    if unknown:
        parser.error(f"unknown peers {unknown}: choose from {', '.join(PEERS)}")
    if not args.weights and not args.smoke:
        parser.error("--weights DIR is needed (or --smoke, which makes a tiny model)")
    if args.new_tokens < 2:
        parser.error("--new-tokens must be >= 2 (one token comes from the prefill)")
    if args.prompt_len < 1 or args.repeats < 1 or not args.batch_sizes or min(args.batch_sizes) < 1:
        parser.error("--prompt-len, --repeats and every batch size must be >= 1")
    return args


class Rows:
    """The static inputs of one batch of B rows: slots 0..B-1, positions,
    tokens, and the tokens made so far (history[r, p] = the token at position p)."""

    def __init__(self, first_tokens, prompt_len, max_len):
        b = first_tokens.shape[0]
        device = first_tokens.device
        self.first_tokens = first_tokens
        self.prompt_len = prompt_len
        self.slots = torch.arange(b, device=device)
        self.positions = torch.full((b,), prompt_len, dtype=torch.int64, device=device)
        self.tokens = first_tokens.clone()
        self.history = torch.zeros((b, max_len + 1), dtype=torch.int64, device=device)

    def reset(self):
        self.positions.fill_(self.prompt_len)
        self.tokens.copy_(self.first_tokens)
        self.history.zero_()

    def generated(self, steps):
        """[B, steps + 1]: the prefill's token, then one per step."""
        made = self.history[:, self.prompt_len + 1:self.prompt_len + 1 + steps]
        return torch.cat((self.first_tokens[:, None], made), dim=1).cpu()


def greedy_step(model, cache, slots, positions, tokens, history, context):
    """One decode step with greedy selection, all on the device: the next
    token goes into `tokens` and history, positions advance by one."""
    logits = model.decode(cache, slots, positions, tokens, context)
    next_tokens = logits.argmax(dim=-1)
    # history's rows are the slots (0..B-1); index_put_, not scatter_: compiled, it stays in place.
    history.index_put_((slots, positions + 1), next_tokens)
    tokens.copy_(next_tokens)
    positions.add_(1)


class Bench:
    def __init__(self, args, weights_dir):
        self.args = args
        self.weights_dir = weights_dir
        self.device = torch.device(args.device)
        self.dtype = llama.dtype_of(args.dtype)
        self.start = time.perf_counter()
        self.end = self.start + args.budget_s
        self.notes = []
        self.model = None
        self.prompts = None
        self.cache = None
        self.eager_tokens = {}
        self.cleanups = []  # run by run_peer after a peer, outside its time limits

    # -- shared --------------------------------------------------------------

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def left(self):
        return self.end - time.perf_counter()

    @property
    def steps(self):
        return self.args.new_tokens - 1

    def context_for(self, step):
        """The context bucket of step `step` (position prompt_len + step)."""
        needed = self.args.prompt_len + step + 1
        for bucket in self.buckets:
            if bucket >= needed:
                return bucket
        raise AssertionError("positions are checked against max_len at start-up")

    def agreement(self, batch, tokens):
        reference = self.eager_tokens.get(batch)
        if reference is None or reference.shape != tokens.shape:
            return None
        return float((reference == tokens).float().mean())

    def load(self):
        self.model = llama.load(self.weights_dir, self.device, self.dtype)
        config = self.model.config
        if self.args.prompt_len + self.args.new_tokens > config.max_len:
            raise ValueError(f"prompt_len + new_tokens = {self.args.prompt_len + self.args.new_tokens} "
                             f"exceeds max_len {config.max_len}")
        self.buckets = sorted({b for b in self.args.context_buckets if b < config.max_len} | {config.max_len})
        generator = torch.Generator().manual_seed(self.args.seed)
        self.prompts = torch.randint(0, config.vocab_size, (max(self.args.batch_sizes), self.args.prompt_len),
                                     generator=generator).to(self.device)

    def prefill_all(self):
        """The static cache of every row, prefilled once: the static-cache
        peers only rewrite positions from prompt_len on."""
        if self.cache is not None:
            return
        rows = self.prompts.shape[0]
        self.cache = llama.KvCache(self.model.config, rows, self.device, self.dtype)
        firsts = [self.model.prefill(self.cache, r, self.prompts[r]).argmax() for r in range(rows)]
        self.first_tokens = torch.stack(firsts)
        self.rows = {b: Rows(self.first_tokens[:b].clone(), self.args.prompt_len, self.model.config.max_len)
                     for b in self.args.batch_sizes}
        self.sync()

    def step_args(self, rows):
        return (self.model, self.cache, rows.slots, rows.positions, rows.tokens, rows.history)

    def time_runs(self, rows, run_steps):
        samples = []
        for _ in range(self.args.repeats):
            rows.reset()
            self.sync()
            begin = time.perf_counter()
            run_steps()
            self.sync()
            samples.append((time.perf_counter() - begin) * 1e3 / self.steps)
        return samples

    def result(self, batch, samples, **extra):
        ms = statistics.median(samples)
        return {"batch": batch, "status": "ok", "error": None, "steps": self.steps, "ms_per_step": ms,
                "tokens_per_s": batch * 1e3 / ms if ms > 0 else None, **extra}

    # -- the static-cache peers ------------------------------------------------

    def run_eager(self, peer):
        self.prefill_all()
        for batch in self.args.batch_sizes:
            rows = self.rows[batch]
            step_args = self.step_args(rows)

            def run_steps():
                for s in range(self.steps):
                    greedy_step(*step_args, self.context_for(s))

            yield batch, lambda: self.measure_static(batch, rows, run_steps, warmup_runs=1)

    def run_cuda_graphs(self, peer):
        if self.device.type != "cuda":
            raise RuntimeError("needs a CUDA device")
        self.prefill_all()
        contexts = sorted({self.context_for(s) for s in range(self.steps)})
        pool = torch.cuda.graph_pool_handle()
        graphs = {}
        self.cleanups.append(graphs.clear)
        begin = time.perf_counter()
        # Largest first, so that the smaller graphs reuse the pool's blocks.
        for batch in sorted(self.args.batch_sizes, reverse=True):
            rows = self.rows[batch]
            for context in sorted(contexts, reverse=True):
                # Warm up on a side stream (cuBLAS workspaces, lazy inits), as
                # torch.cuda.graphs' documentation does; the cache positions it
                # writes are rewritten before they are read.
                side = torch.cuda.Stream(self.device)
                side.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(side):
                    for _ in range(2):
                        greedy_step(*self.step_args(rows), context)
                torch.cuda.current_stream(self.device).wait_stream(side)
                rows.reset()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    greedy_step(*self.step_args(rows), context)
                graphs[(batch, context)] = graph
        self.sync()
        peer["details"] = {"graphs": len(graphs), "capture_s": time.perf_counter() - begin}
        peer["setup_s"] = peer["details"]["capture_s"]
        for batch in self.args.batch_sizes:
            rows = self.rows[batch]
            replays = [graphs[(batch, self.context_for(s))].replay for s in range(self.steps)]

            def run_steps():
                for replay in replays:
                    replay()

            yield batch, lambda: self.measure_static(batch, rows, run_steps, warmup_runs=1)

    def run_compile(self, peer, mode="reduce-overhead"):
        import torch._dynamo as dynamo
        from torch._dynamo.utils import counters
        self.prefill_all()
        # One compiled shape per (batch, context bucket): more than dynamo's
        # default of 8 recompilations of one function.
        limit = 4 * len(self.args.batch_sizes) * len(self.buckets) + 8
        dynamo_config = dynamo.config
        for key in ("recompile_limit", "accumulated_recompile_limit"):
            if not hasattr(dynamo_config, key):  # before torch 2.6
                key = key.replace("recompile_limit", "cache_size_limit")
            setattr(dynamo_config, key, max(getattr(dynamo_config, key), limit))
        # Static addresses: cudagraph trees then neither copy these inputs nor
        # refuse their in-place updates (the weights are the Module's buffers,
        # static already).
        for tensor in (self.cache.k, self.cache.v):
            dynamo.mark_static_address(tensor)
        for rows in self.rows.values():
            for tensor in (rows.slots, rows.positions, rows.tokens, rows.history):
                dynamo.mark_static_address(tensor)
        # max-autotune also captures CUDA graphs (as reduce-overhead does) and
        # benchmarks Triton and cuBLAS choices for each product first.
        compiled = torch.compile(greedy_step, mode=mode, dynamic=False)
        compile_end = min(self.end, time.perf_counter() + self.args.compile_budget_s)
        peer["details"] = {"recompile_limit": limit, "mode": mode}
        counters.clear()

        def cleanup():
            peer["details"].update(graph_breaks=sum(counters["graph_break"].values()),
                                   cudagraph_skips=counters["inductor"]["cudagraph_skips"])
            dynamo.reset()  # frees the compiled graphs and their CUDA graph pool

        self.cleanups.append(cleanup)
        for batch in self.args.batch_sizes:
            rows = self.rows[batch]
            step_args = self.step_args(rows)

            def run_steps():
                for s in range(self.steps):
                    torch.compiler.cudagraph_mark_step_begin()
                    compiled(*step_args, self.context_for(s))

            yield batch, lambda: self.measure_static(batch, rows, run_steps, warmup_runs=2,
                                                     first_warmup_key="compile_s"), compile_end

    def measure_static(self, batch, rows, run_steps, warmup_runs, first_warmup_key=None):
        extra = {}
        begin = time.perf_counter()
        for i in range(warmup_runs):
            rows.reset()
            run_steps()
            self.sync()
            if i == 0 and first_warmup_key:
                extra[first_warmup_key] = time.perf_counter() - begin
        extra["warmup_s"] = time.perf_counter() - begin
        samples = self.time_runs(rows, run_steps)
        tokens = rows.generated(self.steps)
        return self.result(batch, samples, samples_ms_per_step=samples, **extra,
                           token_agreement_vs_eager=self.agreement(batch, tokens)), tokens

    # -- the Hugging Face peers --------------------------------------------------

    def run_hf(self, peer, cache_implementation):
        import transformers  # noqa: F401  (a clear ImportError before the model is built)
        begin = time.perf_counter()
        hf = llama.to_hf(self.weights_dir, self.device, self.dtype, attn_implementation=self.args.hf_attn)
        self.sync()
        peer["setup_s"] = time.perf_counter() - begin
        n, prompt_len = self.args.new_tokens, self.args.prompt_len
        if cache_implementation:
            import torch._dynamo as dynamo
            self.cleanups.append(dynamo.reset)  # generate's compiled forward and its CUDA graphs
        for batch in self.args.batch_sizes:
            ids = self.prompts[:batch]
            mask = torch.ones_like(ids)

            def generate(new_tokens):
                options = dict(attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                               min_new_tokens=new_tokens)
                if cache_implementation:
                    options.update(cache_implementation=cache_implementation, max_cache_len=prompt_len + n)
                return hf.generate(ids, **options)

            def measure():
                extra = {}
                start = time.perf_counter()
                out = generate(n)
                self.sync()
                if cache_implementation:
                    extra["compile_s"] = time.perf_counter() - start  # its first call compiles
                for _ in range(2 if cache_implementation else 1):
                    generate(1)
                    out = generate(n)
                self.sync()
                extra["warmup_s"] = time.perf_counter() - start
                if tuple(out.shape) != (batch, prompt_len + n):
                    raise RuntimeError(f"generate made {out.shape[1] - prompt_len} tokens, not {n}")
                full, prefill = [], []
                for _ in range(self.args.repeats):
                    for new_tokens, into in ((n, full), (1, prefill)):
                        self.sync()
                        t0 = time.perf_counter()
                        generate(new_tokens)
                        self.sync()
                        into.append((time.perf_counter() - t0) * 1e3)
                generate_ms, prefill_ms = statistics.median(full), statistics.median(prefill)
                ms = (generate_ms - prefill_ms) / (n - 1)
                tokens = out[:, prompt_len:].cpu()
                return {"batch": batch, "status": "ok", "error": None, "steps": n - 1, "ms_per_step": ms,
                        "tokens_per_s": batch * 1e3 / ms if ms > 0 else None,
                        "generate_ms": generate_ms, "prefill_ms": prefill_ms,
                        "samples_generate_ms": full, "samples_prefill_ms": prefill, **extra,
                        "token_agreement_vs_eager": self.agreement(batch, tokens)}, tokens

            yield batch, measure

    # -- driver ------------------------------------------------------------------

    def run_peer(self, name):
        peer = {"label": PEERS[name], "status": "ok", "error": None, "setup_s": None, "details": {}, "results": []}
        runners = {
            "eager": lambda: self.run_eager(peer),
            "cuda_graphs": lambda: self.run_cuda_graphs(peer),
            "compile": lambda: self.run_compile(peer),
            "compile_max_autotune": lambda: self.run_compile(peer, "max-autotune"),
            "hf_eager": lambda: self.run_hf(peer, None),
            "hf_static": lambda: self.run_hf(peer, "static"),
        }
        done = set()
        batches = runners[name]()
        try:
            with deadline(self.end):
                for item in batches:
                    batch, measure = item[0], item[1]
                    end = item[2] if len(item) > 2 else self.end
                    if time.perf_counter() >= end:
                        budget = "compile" if end < self.end else "run"
                        peer["results"].append(self.skipped(batch, f"the {budget} time budget was spent "
                                                                   "before this batch"))
                        done.add(batch)
                        continue
                    try:
                        with deadline(end, "compile") if end < self.end else contextlib.nullcontext():
                            result, tokens = measure()
                        if name == "eager":
                            self.eager_tokens[batch] = tokens
                    except OutOfTime as exc:
                        if exc.budget == "run":
                            raise
                        result = self.skipped(batch, message_of(exc))
                        self.recover()
                    except Exception as exc:  # recorded; the other batches go on
                        result = self.failed(batch, exc)
                        self.recover()
                    peer["results"].append(result)
                    done.add(batch)
                    print(f"decode_peers: {name} batch {batch}: {summary(result)}", file=sys.stderr, flush=True)
        except (Exception, OutOfTime) as exc:  # the run's time budget, or a failure outside a batch
            peer["error"] = message_of(exc)
            peer["status"] = "skipped" if isinstance(exc, OutOfTime) else "failed"
        batches.close()  # drops what the peer holds (its model, graphs) before the cleanups
        del batches
        while self.cleanups:
            try:
                self.cleanups.pop()()
            except Exception as exc:  # noqa: BLE001  (a cleanup failure is a note, not a stop)
                self.notes.append(f"{name}: cleanup failed: {message_of(exc)}")
        self.recover()
        for batch in self.args.batch_sizes:
            if batch not in done:
                peer["results"].append(self.skipped(batch, peer["error"] or "not reached"))
        statuses = {r["status"] for r in peer["results"]}
        if peer["error"] is None:
            peer["status"] = "ok" if statuses == {"ok"} else ("failed" if "ok" not in statuses else "partial")
        elif "ok" in statuses:
            peer["status"] = "partial"
        if peer["status"] != "ok":
            print(f"decode_peers: {name}: {peer['status']}: {peer['error'] or ''}", file=sys.stderr, flush=True)
        return peer

    def skipped(self, batch, why):
        return {"batch": batch, "status": "skipped", "error": why}

    def failed(self, batch, exc):
        return {"batch": batch, "status": "failed", "error": message_of(exc)}

    def recover(self):
        """After a failure: drop what it left and let pending work finish."""
        gc.collect()
        if self.device.type == "cuda":
            with contextlib.suppress(Exception):
                torch.cuda.synchronize(self.device)
                torch.cuda.empty_cache()


def summary(result):
    if result["status"] != "ok":
        return f"{result['status']}: {result['error']}"
    agree = result.get("token_agreement_vs_eager")
    return (f"{result['ms_per_step']:.3f} ms/step, {result['tokens_per_s']:.0f} tokens/s"
            + (f", agreement with eager {agree:.3f}" if agree is not None else ""))


def environment(device):
    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": None,
           "device": str(device), "cuda": torch.version.cuda}
    with contextlib.suppress(Exception):
        import transformers
        env["transformers"] = transformers.__version__
    if device.type == "cuda" and torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name(device)
    return env


def main(argv=None):
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        weights_dir = args.weights
        if weights_dir is None:  # --smoke without weights: a tiny random model
            weights_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="llm_decode_smoke_"))
            llama.write_random(weights_dir, "tiny", seed=args.seed, dtype=args.dtype)
        bench = Bench(args, weights_dir)
        report = {"schema": SCHEMA, "complete": False, "notes": [], "environment": environment(bench.device),
                  "model": {"weights": str(args.weights) if args.weights else "(smoke: tiny random model)"},
                  "settings": {"batch_sizes": args.batch_sizes, "prompt_len": args.prompt_len,
                               "new_tokens": args.new_tokens, "steps": args.new_tokens - 1,
                               "repeats": args.repeats, "context_buckets": None, "peers": args.peers,
                               "hf_attn_implementation": args.hf_attn, "budget_s": args.budget_s,
                               "compile_budget_s": args.compile_budget_s, "seed": args.seed, "smoke": args.smoke},
                  "method": {
                      "static_cache_peers": "prompts prefilled once (not timed); per timed run: reset positions "
                                            "and tokens, cuda synchronize, perf_counter, new_tokens - 1 greedy "
                                            "steps, cuda synchronize, perf_counter; ms_per_step = run / steps; "
                                            "median over repeats; warm-up runs not timed",
                      "hf_peers": "ms_per_step = (median T(generate max_new_tokens=N) - median T(generate "
                                  "max_new_tokens=1)) / (N - 1), each T between cuda synchronizes; greedy, no eos, "
                                  "min_new_tokens = max_new_tokens; warm-up calls not timed"},
                  "peers": {}}
        try:
            with torch.no_grad():
                bench.load()
                config = bench.model.config
                parameters = sum(math.prod(shape) for shape in llama.weight_shapes(config).values())
                report["model"].update(config=config.to_dict(), dtype=args.dtype, parameters=parameters)
                report["settings"]["context_buckets"] = bench.buckets
                for name in args.peers:
                    if bench.left() <= 0:
                        report["peers"][name] = {"label": PEERS[name], "status": "skipped",
                                                 "error": "the run time budget was spent", "setup_s": None,
                                                 "details": {}, "results": [bench.skipped(b, "the run time budget was spent")
                                                                            for b in args.batch_sizes]}
                        continue
                    report["peers"][name] = bench.run_peer(name)
        except Exception as exc:  # the model itself did not load: nothing ran
            report["notes"].append(f"setup failed: {message_of(exc)}")
        report["notes"] += bench.notes
        for name, peer in report["peers"].items():
            for result in peer["results"]:
                if result["status"] != "ok":
                    report["notes"].append(f"{name} batch {result['batch']}: {result['status']}: {result['error']}")
        report["complete"] = (set(report["peers"]) == set(args.peers)
                              and all(p["status"] == "ok" for p in report["peers"].values()))
        report["elapsed_s"] = time.perf_counter() - bench.start
        text = json.dumps(report, indent=2)
        if args.json:
            pathlib.Path(args.json).write_text(text + "\n")
        print(text)
    return 0 if report["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
