#!/usr/bin/env python3
"""Checks the C++ LLM decode example (examples/llm_decode) against the Python
model (examples/llm_decode/llama.py) on the same weights, and the Python
model against Hugging Face's LlamaForCausalLM.

    python3 scripts/llm_decode_compare.py WEIGHTS_DIR REFERENCE_JSON
        [--device cuda] [--dtype float16] [--atol A] [--min-agreement 0.95]
        [--no-hf | --require-hf] [--json OUT]

REFERENCE_JSON is written by the C++ program; its format,
"replay.llm_decode.reference/1":
  {"format": "replay.llm_decode.reference/1",
   "requests": [
     {"prompt": [int, ...],           token ids, 1 <= len <= max_len
      "tokens": [int, ...],           the greedy tokens C++ made: tokens[0] is
                                      the argmax of the prefill's logits,
                                      tokens[i + 1] the argmax of decode step i,
                                      whose input is tokens[i] at position
                                      len(prompt) + i
      "prefill_logits": [float, ...], optional: the prefill's logits, [vocab]
      "decode_logits": [[float, ...], ...]
                                      optional: decode_logits[i] = the logits of
                                      decode step i, [vocab], for the first few
                                      steps (any number up to len(tokens) - 1)
     }, ...]}
  Other keys (the mode, steps per launch, ...) are ignored and echoed back.

What it does, with the model loaded in --dtype (default: config.json's) on
--device (default cuda when available):
  1. Python static-cache step, the C++ tokens fed back (teacher forcing, so a
     single flipped near-tie does not derail the rest): every request is
     prefilled into its own slot of one KvCache, then all requests are decoded
     as one batch, step i feeding tokens[i]; a request with no step left is a
     padding row on the spare slot. Its logits are compared with the C++ ones
     (max |diff|), and its argmax with the C++ next token at every step
     (agreement; "near ties" also counts a mismatch where the C++ token's
     Python logit is within atol of the Python maximum).
  2. Hugging Face (eager attention: the same math step for step), unless
     --no-hf or transformers is missing (then skipped; --require-hf fails
     instead): one forward over prompt + tokens[:-1] per request; its logits
     against llama.py's forward_full over the same tokens (the math) and
     against step 1's static-cache logits (the cache path).
Fails (exit 1) when a max |logit diff| exceeds --atol (defaults: float32
1e-4, float16 3e-2, bfloat16 1.5e-1) or the C++/Python token agreement is
below --min-agreement; exit 2 on unusable input.

Output (stdout, and --json OUT), "replay.llm_decode.compare/1":
  {"schema", "ok": bool, "failures": [str], "device", "dtype", "atol",
   "min_agreement", "requests", "reference_extra": {...},
   "cpp_vs_python": {"max_abs_logit_diff", "prefill_max_abs_logit_diff",
                     "decode_max_abs_logit_diff", "mean_abs_logit_diff", "max_abs_logit",
                     "logit_rows_compared",
                     "tokens_compared", "token_agreement", "token_agreement_near_ties",
                     "mismatches": [{"request", "step" (-1: prefill), "cpp", "python",
                                     "gap" (Python max - Python logit of the C++ token)}] (first 20)},
   "python_vs_hf": {"status": "ok" | "skipped", "reason", "attn_implementation",
                    "max_abs_logit_diff_full_forward", "max_abs_logit_diff_static_cache",
                    "positions_compared", "hf_token_agreement_with_cpp"}}
"""
import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples" / "llm_decode"))

import torch  # noqa: E402

import llama  # noqa: E402

FORMAT = "replay.llm_decode.reference/1"
SCHEMA = "replay.llm_decode.compare/1"
DEFAULT_ATOL = {"float32": 1e-4, "float16": 3e-2, "bfloat16": 1.5e-1}


class BadInput(Exception):
    pass


def read_reference(path, config):
    with open(path) as f:
        reference = json.load(f)
    if reference.get("format") != FORMAT:
        raise BadInput(f"{path}: format {reference.get('format')!r}, expected {FORMAT!r}")
    requests = reference.get("requests")
    if not isinstance(requests, list) or not requests:
        raise BadInput(f"{path}: no requests")
    for n, request in enumerate(requests):
        prompt, tokens = request.get("prompt"), request.get("tokens")
        if not prompt or not tokens:
            raise BadInput(f"request {n}: needs a non-empty prompt and tokens")
        for token in prompt + tokens:
            if not isinstance(token, int) or not 0 <= token < config.vocab_size:
                raise BadInput(f"request {n}: token {token!r} is not in [0, {config.vocab_size})")
        if len(prompt) + len(tokens) - 1 > config.max_len:
            raise BadInput(f"request {n}: prompt {len(prompt)} + fed tokens {len(tokens) - 1} exceed "
                           f"max_len {config.max_len}")
        rows = ([request["prefill_logits"]] if request.get("prefill_logits") is not None else []) + list(
            request.get("decode_logits") or [])
        if any(len(row) != config.vocab_size for row in rows):
            raise BadInput(f"request {n}: a logits row is not {config.vocab_size} long")
        if len(request.get("decode_logits") or []) > len(tokens) - 1:
            raise BadInput(f"request {n}: more decode_logits than decode steps ({len(tokens) - 1})")
    return reference


def context_bucket(needed, max_len):
    bucket = 16
    while bucket < needed:
        bucket *= 2
    return min(bucket, max_len)


def python_static_cache_logits(model, requests):
    """Teacher-forced prefill + batched decode of every request: per request,
    [prefill logits] + [logits of decode step i for i < len(tokens) - 1], float32 on the CPU."""
    device, config = model.device, model.config
    cache = llama.KvCache(config, len(requests), device, model.dtype)
    out = []
    for r, request in enumerate(requests):
        prompt = torch.tensor(request["prompt"], dtype=torch.int64, device=device)
        out.append([model.prefill(cache, r, prompt).cpu()])
    steps = max(len(request["tokens"]) - 1 for request in requests)
    for i in range(steps):
        active = [i < len(request["tokens"]) - 1 for request in requests]
        slots = [r if a else cache.spare_slot for r, a in enumerate(active)]
        positions = [len(request["prompt"]) + i if a else 0 for request, a in zip(requests, active)]
        tokens = [request["tokens"][i] if a else 0 for request, a in zip(requests, active)]

        def on_device(values):
            return torch.tensor(values, dtype=torch.int64, device=device)

        logits = model.decode(cache, on_device(slots), on_device(positions), on_device(tokens),
                              context_bucket(max(positions) + 1, config.max_len)).float().cpu()
        for r, a in enumerate(active):
            if a:
                out[r].append(logits[r])
    return out


def compare_cpp(requests, python_logits, atol):
    prefill_diff = decode_diff = None
    max_logit = abs_sum = 0.0
    rows = agree = near = 0
    mismatches = []
    for r, (request, ours) in enumerate(zip(requests, python_logits)):
        cpp_rows = [(0, request.get("prefill_logits"))] + [
            (i + 1, row) for i, row in enumerate(request.get("decode_logits") or [])]
        for index, row in cpp_rows:
            if row is None:
                continue
            cpp = torch.tensor(row, dtype=torch.float32)
            abs_diff = (cpp - ours[index]).abs()
            diff = float(abs_diff.max())
            abs_sum += float(abs_diff.mean())
            max_logit = max(max_logit, float(cpp.abs().max()))
            rows += 1
            if index == 0:
                prefill_diff = diff if prefill_diff is None else max(prefill_diff, diff)
            else:
                decode_diff = diff if decode_diff is None else max(decode_diff, diff)
        for index, cpp_token in enumerate(request["tokens"]):
            logits = ours[index]
            python_token = int(logits.argmax())
            gap = float(logits.max() - logits[cpp_token])
            agree += python_token == cpp_token
            near += python_token == cpp_token or gap <= atol
            if python_token != cpp_token and len(mismatches) < 20:
                mismatches.append({"request": r, "step": index - 1, "cpp": cpp_token, "python": python_token,
                                   "gap": gap})
    compared = sum(len(request["tokens"]) for request in requests)
    diffs = [d for d in (prefill_diff, decode_diff) if d is not None]
    return {"max_abs_logit_diff": max(diffs) if diffs else None, "prefill_max_abs_logit_diff": prefill_diff,
            "decode_max_abs_logit_diff": decode_diff, "mean_abs_logit_diff": abs_sum / rows if rows else None,
            "max_abs_logit": max_logit, "logit_rows_compared": rows,
            "tokens_compared": compared, "token_agreement": agree / compared,
            "token_agreement_near_ties": near / compared, "mismatches": mismatches}


def compare_hf(args, model, requests, python_logits):
    try:
        import transformers
        from transformers import LlamaForCausalLM  # noqa: F401  (it has its own requirements)
    except ImportError as exc:
        return {"status": "skipped", "reason": f"transformers' LlamaForCausalLM is not importable ({exc})"}
    hf = llama.to_hf(args.weights, model.device, model.dtype, attn_implementation="eager")
    full_diff = cache_diff = 0.0
    positions = hf_agree = 0
    with torch.no_grad():
        for request, ours in zip(requests, python_logits):
            sequence = request["prompt"] + request["tokens"][:-1]
            ids = torch.tensor(sequence, dtype=torch.int64, device=model.device)
            hf_logits = hf(input_ids=ids[None]).logits[0].float()
            full_diff = max(full_diff, float((hf_logits - model.forward_full(ids)).abs().max()))
            tail = hf_logits[len(request["prompt"]) - 1:].cpu()  # prefill, then one row per decode step
            cache_diff = max(cache_diff, float((tail - torch.stack(ours)).abs().max()))
            positions += tail.shape[0]
            hf_agree += sum(int(tail[i].argmax()) == t for i, t in enumerate(request["tokens"]))
    return {"status": "ok", "reason": None, "attn_implementation": "eager",
            "transformers": transformers.__version__, "max_abs_logit_diff_full_forward": full_diff,
            "max_abs_logit_diff_static_cache": cache_diff, "positions_compared": positions,
            "hf_token_agreement_with_cpp": hf_agree / positions}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("weights", help="weights directory (config.json + weights.pt)")
    parser.add_argument("reference", help="the C++ program's reference JSON")
    parser.add_argument("--device")
    parser.add_argument("--dtype", choices=sorted(DEFAULT_ATOL), help="default: config.json's torch_dtype")
    parser.add_argument("--atol", type=float, help="max |logit diff| allowed (default by dtype, see above)")
    parser.add_argument("--min-agreement", type=float, default=0.95)
    hf_choice = parser.add_mutually_exclusive_group()
    hf_choice.add_argument("--no-hf", action="store_true", help="skip the Hugging Face comparison")
    hf_choice.add_argument("--require-hf", action="store_true", help="fail when transformers is missing")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        config = llama.read_config(pathlib.Path(args.weights) / llama.CONFIG_FILE)
        dtype_name = args.dtype or config.torch_dtype
        atol = args.atol if args.atol is not None else DEFAULT_ATOL[dtype_name]
        reference = read_reference(args.reference, config)
        model = llama.load(args.weights, device, llama.dtype_of(dtype_name))
    except (BadInput, ValueError, OSError, json.JSONDecodeError) as exc:
        print(f"llm_decode_compare: {exc}", file=sys.stderr)
        return 2
    requests = reference["requests"]
    with torch.no_grad():
        python_logits = python_static_cache_logits(model, requests)
    report = {"schema": SCHEMA, "ok": True, "failures": [], "device": str(device), "dtype": dtype_name,
              "atol": atol, "min_agreement": args.min_agreement, "requests": len(requests),
              "reference_extra": {k: v for k, v in reference.items() if k not in ("format", "requests")},
              "cpp_vs_python": compare_cpp(requests, python_logits, atol)}
    if args.no_hf:
        report["python_vs_hf"] = {"status": "skipped", "reason": "--no-hf"}
    else:
        report["python_vs_hf"] = compare_hf(args, model, requests, python_logits)

    failures = report["failures"]
    cpp = report["cpp_vs_python"]
    if cpp["max_abs_logit_diff"] is not None and cpp["max_abs_logit_diff"] > atol:
        failures.append(f"C++ vs Python: max |logit diff| {cpp['max_abs_logit_diff']:.3g} > atol {atol:.3g}")
    if cpp["token_agreement"] < args.min_agreement:
        failures.append(f"C++ vs Python: token agreement {cpp['token_agreement']:.4f} < {args.min_agreement}")
    hf = report["python_vs_hf"]
    if hf["status"] == "ok":
        for key in ("max_abs_logit_diff_full_forward", "max_abs_logit_diff_static_cache"):
            if hf[key] > atol:
                failures.append(f"Python vs Hugging Face: {key} {hf[key]:.3g} > atol {atol:.3g}")
    elif args.require_hf:
        failures.append(f"Python vs Hugging Face skipped: {hf['reason']}")
    report["ok"] = not failures

    text = json.dumps(report, indent=2)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    print(text)
    diff = cpp["max_abs_logit_diff"]
    print(f"llm_decode_compare: {len(requests)} requests, {cpp['tokens_compared']} tokens: "
          f"max |logit diff| C++ vs Python {'-' if diff is None else f'{diff:.3g}'} "
          f"({cpp['logit_rows_compared']} rows), agreement {cpp['token_agreement']:.4f} "
          f"(near ties {cpp['token_agreement_near_ties']:.4f}); Hugging Face: "
          + (f"full forward {hf['max_abs_logit_diff_full_forward']:.3g}, static cache "
             f"{hf['max_abs_logit_diff_static_cache']:.3g}" if hf["status"] == "ok" else f"skipped ({hf['reason']})")
          + f"; {'OK' if report['ok'] else 'FAILED: ' + '; '.join(failures)}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
