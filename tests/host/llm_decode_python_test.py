#!/usr/bin/env python3
"""The Python side of the LLM decode example, on the CPU in float32:
examples/llm_decode/llama.py (its static-cache prefill and decode against its
own full forward, and against transformers' LlamaForCausalLM when transformers
is importable), scripts/llm_decode_compare.py (passes on agreeing input, fails
on logits or tokens that differ, refuses bad input), and
bench/llm_decode/decode_peers.py --smoke with the peers that run on a CPU
(its JSON, a failing peer recorded, the time budgets).

Exits 77 (ctest: skipped) when torch cannot be imported.
"""
import contextlib
import dataclasses
import io
import json
import pathlib
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "llm_decode"))
sys.path.insert(0, str(ROOT / "bench" / "llm_decode"))
sys.path.insert(0, str(ROOT / "scripts"))

try:
    import torch
except ImportError as exc:
    print(f"llm_decode_python_test: skipped: torch is not importable ({exc})")
    sys.exit(77)

import llama  # noqa: E402


def missing(statement):
    """Why `statement` cannot run here, or None."""
    try:
        exec(statement, {})
        return None
    except Exception as exc:  # an optional part of the environment
        return f"{statement!r} fails: {type(exc).__name__}: {exc}"


# torch.compile needs torch's optional dependencies (sympy, networkx) and a C++
# compiler for the CPU; LlamaForCausalLM needs transformers (and sympy).
NO_COMPILE = missing("import torch._dynamo, torch._inductor.compile_fx")
NO_HF = missing("from transformers import LlamaForCausalLM")
HAVE_HF = NO_HF is None
NEED_HF = unittest.skipIf(NO_HF, NO_HF)
NEED_COMPILE = unittest.skipIf(NO_COMPILE, NO_COMPILE)

TINY_UNTIED = llama.LlamaConfig.preset("tiny", tie_word_embeddings=False, torch_dtype="float32")
TINY_TIED = llama.LlamaConfig.preset("tiny", torch_dtype="float32")


def random_tokens(count, vocab, seed):
    return torch.randint(0, vocab, (count,), generator=torch.Generator().manual_seed(seed))


class WeightsDir:
    """A temporary weights directory of a random model."""

    def __init__(self, config, seed=0, dtype=None):
        self.temp = tempfile.TemporaryDirectory(prefix="llm_decode_test_")
        self.path = pathlib.Path(self.temp.name)
        self.config = llama.write_random(self.path, config, seed=seed, dtype=dtype)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.temp.cleanup()


def greedy(model, prompt, new_tokens):
    """Our greedy tokens (new_tokens of them, the first from the prefill)."""
    cache = llama.KvCache(model.config, 1, "cpu", model.dtype)
    token = model.prefill(cache, 0, prompt).argmax()
    made = [int(token)]
    for i in range(new_tokens - 1):
        logits = model.decode(cache, torch.tensor([0]), torch.tensor([len(prompt) + i]), token.reshape(1),
                              model.config.max_len)
        token = logits[0].argmax()
        made.append(int(token))
    return made


class ModelTest(unittest.TestCase):
    def test_config_and_weights_files(self):
        with self.assertRaisesRegex(ValueError, "tiny, small, 1b"):
            llama.LlamaConfig.preset("huge")
        with self.assertRaisesRegex(ValueError, "multiple"):
            dataclasses.replace(TINY_TIED, num_key_value_heads=3)
        self.assertEqual(llama.LlamaConfig.preset("1b").head_dim, 64)
        for config in (TINY_TIED, TINY_UNTIED):
            with WeightsDir(config) as weights, tempfile.TemporaryDirectory() as again:
                self.assertEqual(llama.read_config(weights.path / llama.CONFIG_FILE), config)
                stored = torch.load(weights.path / llama.WEIGHTS_FILE, weights_only=True)
                self.assertEqual("lm_head.weight" in stored, not config.tie_word_embeddings)
                model = llama.load(weights.path, "cpu")
                self.assertEqual(model.dtype, torch.float32)
                model.save(again)
                self.assertEqual(llama.read_config(pathlib.Path(again) / llama.CONFIG_FILE), config)
                resaved = torch.load(pathlib.Path(again) / llama.WEIGHTS_FILE, weights_only=True)
                self.assertEqual(sorted(resaved), sorted(stored))
                for name, tensor in stored.items():
                    self.assertTrue(torch.equal(resaved[name], tensor), name)
                # Loading checks names and shapes.
                broken = dict(stored)
                broken.pop("model.norm.weight")
                torch.save(broken, pathlib.Path(again) / llama.WEIGHTS_FILE)
                with self.assertRaisesRegex(ValueError, "missing.*model.norm.weight"):
                    llama.load(again, "cpu")
                if config.tie_word_embeddings:  # a tied lm_head written anyway: the embedding or refused
                    torch.save(dict(stored, **{"lm_head.weight": stored["model.embed_tokens.weight"]}),
                               pathlib.Path(again) / llama.WEIGHTS_FILE)
                    llama.load(again, "cpu")
                    torch.save(dict(stored, **{"lm_head.weight": stored["model.embed_tokens.weight"] * 2}),
                               pathlib.Path(again) / llama.WEIGHTS_FILE)
                    with self.assertRaisesRegex(ValueError, "lm_head.weight differs"):
                        llama.load(again, "cpu")
                broken = dict(stored, **{"model.norm.weight": torch.ones(3)})
                torch.save(broken, pathlib.Path(again) / llama.WEIGHTS_FILE)
                with self.assertRaisesRegex(ValueError, "model.norm.weight has shape"):
                    llama.load(again, "cpu")

    def test_weights_written_as_cpp_writes_them(self):
        # torch._C._pickle_save is torch::pickle_save, what the C++ example
        # writes weights.pt with (a typed c10::Dict<std::string, at::Tensor>).
        with WeightsDir(TINY_UNTIED, seed=2) as weights:
            stored = torch.load(weights.path / llama.WEIGHTS_FILE, weights_only=True)
            expected = llama.load(weights.path, "cpu").forward_full(torch.arange(10))
            (weights.path / llama.WEIGHTS_FILE).write_bytes(torch._C._pickle_save(stored))
            with self.assertRaisesRegex(Exception, "restore_type_tag"):
                torch.load(weights.path / llama.WEIGHTS_FILE, weights_only=True)
            self.assertTrue(torch.equal(llama.load(weights.path, "cpu").forward_full(torch.arange(10)), expected))

    def test_random_weights_are_seeded(self):
        a, b = llama.random_weights(TINY_TIED, 5), llama.random_weights(TINY_TIED, 5)
        c = llama.random_weights(TINY_TIED, 6)
        name = "model.layers.1.mlp.up_proj.weight"
        self.assertTrue(torch.equal(a[name], b[name]))
        self.assertFalse(torch.equal(a[name], c[name]))
        self.assertAlmostEqual(float(a[name].std()), 0.02, delta=0.002)
        self.assertTrue(torch.equal(a["model.norm.weight"], torch.ones(64)))

    def check_cache_path(self, config, dtype, tolerance):
        model = llama.LlamaModel.random(config, 3, "cpu", dtype)
        lengths = [5, 1, 12]
        new_tokens = 9
        sequences = [random_tokens(n + new_tokens, config.vocab_size, seed=n) for n in lengths]
        full = [model.forward_full(s) for s in sequences]
        cache = llama.KvCache(config, 4, "cpu", dtype)
        self.assertEqual(cache.spare_slot, 4)
        self.assertEqual(tuple(cache.k.shape), (2, 5, 2, 64, 16))
        slot_of = [3, 0, 2]  # not the row order
        for r, (n, s) in enumerate(zip(lengths, sequences)):
            logits = model.prefill(cache, slot_of[r], s[:n])
            self.assertEqual(logits.dtype, torch.float32)
            self.assertEqual(tuple(logits.shape), (config.vocab_size,))
            torch.testing.assert_close(logits, full[r][n - 1], atol=tolerance, rtol=0)
        for i in range(new_tokens):
            # Rows: the three requests in another order, with padding rows on
            # the spare slot between them; contexts from tight to max_len.
            order = [2, 0, 1]
            slots = [slot_of[order[0]], cache.spare_slot, slot_of[order[1]], slot_of[order[2]], cache.spare_slot]
            positions = [lengths[order[0]] + i, 0, lengths[order[1]] + i, lengths[order[2]] + i, 0]
            tokens = [int(sequences[order[0]][positions[0]]), 7,
                      int(sequences[order[1]][positions[2]]), int(sequences[order[2]][positions[3]]), 9]
            context = [max(positions) + 1, 32, config.max_len][i % 3]
            logits = model.decode(cache, torch.tensor(slots), torch.tensor(positions), torch.tensor(tokens), context)
            self.assertEqual(logits.dtype, dtype)
            self.assertEqual(tuple(logits.shape), (5, config.vocab_size))
            for row, r in ((0, order[0]), (2, order[1]), (3, order[2])):
                torch.testing.assert_close(logits[row].float(), full[r][positions[row]], atol=tolerance, rtol=0)
        # The spare slot took the padding rows' writes; the other slots hold
        # exactly their rows' keys (slot 1 was never used).
        self.assertFalse(bool(cache.k[:, 1].any()))
        self.assertTrue(bool(cache.k[:, cache.spare_slot, :, 0].any()))

    def test_prefill_and_decode_equal_the_full_forward(self):
        self.check_cache_path(TINY_UNTIED, torch.float32, 1e-5)
        self.check_cache_path(TINY_TIED, torch.float32, 1e-5)

    def test_prefill_and_decode_in_float16(self):
        self.check_cache_path(TINY_UNTIED, torch.float16, 2e-3)

    def test_bad_arguments(self):
        model = llama.LlamaModel.random(TINY_TIED, 0, "cpu", torch.float32)
        cache = llama.KvCache(TINY_TIED, 2, "cpu", torch.float32)
        with self.assertRaisesRegex(ValueError, "spare"):
            model.prefill(cache, 2, torch.tensor([1, 2]))
        with self.assertRaisesRegex(ValueError, "max_len"):
            model.prefill(cache, 0, torch.zeros(65, dtype=torch.int64))


@NEED_HF
class HuggingFaceTest(unittest.TestCase):
    def test_logits_equal_llama_for_causal_lm(self):
        for config in (TINY_UNTIED, TINY_TIED):
            with WeightsDir(config, seed=1) as weights:
                model = llama.load(weights.path, "cpu")
                tokens = random_tokens(40, config.vocab_size, seed=2)
                ours = model.forward_full(tokens)
                for attn in ("eager", "sdpa"):
                    hf = llama.to_hf(weights.path, "cpu", attn_implementation=attn)
                    self.assertEqual(hf.config._attn_implementation, attn)
                    with torch.no_grad():
                        theirs = hf(input_ids=tokens[None]).logits[0].float()
                    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0, msg=f"{attn}, tied "
                                               f"{config.tie_word_embeddings}")

    def test_float16_model_keeps_float32_rotary_frequencies(self):
        with WeightsDir(TINY_UNTIED, seed=1, dtype="float16") as weights:
            hf = llama.to_hf(weights.path, "cpu", attn_implementation="eager")
            self.assertEqual(hf.dtype, torch.float16)
            self.assertEqual(hf.model.rotary_emb.inv_freq.dtype, torch.float32)
            self.assertEqual(torch.get_default_dtype(), torch.float32)
            model = llama.load(weights.path, "cpu")
            tokens = random_tokens(30, TINY_UNTIED.vocab_size, seed=4)
            with torch.no_grad():
                theirs = hf(input_ids=tokens[None]).logits[0].float()
            torch.testing.assert_close(theirs, model.forward_full(tokens), atol=2e-3, rtol=0)

    def test_generate_makes_exactly_the_new_tokens_ours_makes(self):
        with WeightsDir(TINY_UNTIED, seed=1) as weights:
            model = llama.load(weights.path, "cpu")
            hf = llama.to_hf(weights.path, "cpu", attn_implementation="sdpa")
            prompts = torch.stack([random_tokens(8, 256, seed=s) for s in range(3)])
            expected = [greedy(model, p, 20) for p in prompts]
            self.assertGreater(len({t for row in expected for t in row}), 3)  # not one repeated token
            for cache_implementation in (None, "static"):
                options = dict(cache_implementation=cache_implementation, max_cache_len=28) \
                    if cache_implementation else {}
                out = hf.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                                  max_new_tokens=20, min_new_tokens=20, **options)
                self.assertEqual(tuple(out.shape), (3, 28))
                self.assertEqual(out[:, 8:].tolist(), expected, cache_implementation)


def python_reference(weights_dir, prompts, new_tokens, logit_steps):
    """A reference JSON made by the Python model itself, one request at a time
    (the C++ program writes the same format)."""
    model = llama.load(weights_dir, "cpu")
    requests = []
    for prompt in prompts:
        cache = llama.KvCache(model.config, 1, "cpu", model.dtype)
        logits = model.prefill(cache, 0, torch.tensor(prompt))
        request = {"prompt": list(prompt), "tokens": [int(logits.argmax())], "prefill_logits": logits.tolist(),
                   "decode_logits": []}
        for i in range(new_tokens - 1):
            step = model.decode(cache, torch.tensor([0]), torch.tensor([len(prompt) + i]),
                                torch.tensor([request["tokens"][-1]]), model.config.max_len)[0]
            if i < logit_steps:
                request["decode_logits"].append(step.tolist())
            request["tokens"].append(int(step.argmax()))
        requests.append(request)
    return {"format": "replay.llm_decode.reference/1", "mode": "python", "requests": requests}


class CompareScriptTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import llm_decode_compare
        cls.compare = llm_decode_compare
        cls.weights = WeightsDir(TINY_UNTIED, seed=3)
        # Prompts of different lengths; the last request stops early, so the
        # comparison's batch pads its row on the spare slot.
        reference = python_reference(cls.weights.path, [[1, 2, 3, 4, 5], [9] * 11], 10, logit_steps=3)
        reference["requests"] += python_reference(cls.weights.path, [[200, 17, 3]], 4, logit_steps=3)["requests"]
        cls.reference = reference

    @classmethod
    def tearDownClass(cls):
        cls.weights.__exit__()

    def run_compare(self, reference, *extra):
        with tempfile.TemporaryDirectory() as temp:
            path = pathlib.Path(temp) / "reference.json"
            path.write_text(json.dumps(reference))
            out = pathlib.Path(temp) / "report.json"
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code = self.compare.main([str(self.weights.path), str(path), "--device", "cpu",
                                          "--json", str(out), *extra])
            report = json.loads(out.read_text()) if out.exists() else None
            return code, report, stderr.getvalue()

    def test_agreeing_reference_passes(self):
        code, report, _ = self.run_compare(self.reference)
        self.assertEqual(code, 0, report["failures"])
        self.assertTrue(report["ok"])
        cpp = report["cpp_vs_python"]
        self.assertLess(cpp["max_abs_logit_diff"], 1e-5)
        self.assertEqual(cpp["logit_rows_compared"], 3 * 4)
        self.assertEqual(cpp["tokens_compared"], 10 + 10 + 4)
        self.assertEqual(cpp["token_agreement"], 1.0)
        self.assertEqual(report["reference_extra"], {"mode": "python"})
        hf = report["python_vs_hf"]
        if HAVE_HF:
            self.assertEqual(hf["status"], "ok")
            self.assertLess(hf["max_abs_logit_diff_full_forward"], 1e-4)
            self.assertLess(hf["max_abs_logit_diff_static_cache"], 1e-4)
            self.assertEqual(hf["positions_compared"], 24)
            self.assertEqual(hf["hf_token_agreement_with_cpp"], 1.0)
        else:
            self.assertEqual(hf["status"], "skipped")

    def test_differing_logits_fail(self):
        reference = json.loads(json.dumps(self.reference))
        reference["requests"][1]["decode_logits"][2][17] += 0.01
        code, report, stderr = self.run_compare(reference, "--no-hf")
        self.assertEqual(code, 1)
        self.assertAlmostEqual(report["cpp_vs_python"]["decode_max_abs_logit_diff"], 0.01, delta=1e-4)
        self.assertIn("max |logit diff|", stderr)
        code, _, _ = self.run_compare(reference, "--no-hf", "--atol", "0.02")
        self.assertEqual(code, 0)

    def test_differing_tokens_fail(self):
        reference = json.loads(json.dumps(self.reference))
        request = reference["requests"][0]
        request["tokens"][9] = (request["tokens"][9] + 1) % 256  # the last token, never fed back
        code, report, _ = self.run_compare(reference, "--no-hf", "--min-agreement", "0.99")
        self.assertEqual(code, 1)
        cpp = report["cpp_vs_python"]
        self.assertAlmostEqual(cpp["token_agreement"], 23 / 24)
        self.assertEqual(cpp["mismatches"], [{"request": 0, "step": 8, "cpp": request["tokens"][9],
                                              "python": self.reference["requests"][0]["tokens"][9],
                                              "gap": cpp["mismatches"][0]["gap"]}])
        self.assertGreater(cpp["mismatches"][0]["gap"], 0)
        code, _, _ = self.run_compare(reference, "--no-hf")  # the default minimum, 0.95
        self.assertEqual(code, 0)

    def test_bad_input_is_refused(self):
        for change, message in ((lambda r: r.update(format="other"), "format"),
                                (lambda r: r["requests"][0].update(tokens=[]), "non-empty"),
                                (lambda r: r["requests"][0]["tokens"].append(256), "not in"),
                                (lambda r: r["requests"][0]["decode_logits"][0].pop(), "long"),
                                (lambda r: r["requests"][0].update(prompt=[1] * 60), "max_len")):
            reference = json.loads(json.dumps(self.reference))
            change(reference)
            code, _, stderr = self.run_compare(reference, "--no-hf")
            self.assertEqual(code, 2, message)
            self.assertIn(message, stderr)


class DecodePeersTest(unittest.TestCase):
    def run_peers(self, *argv):
        import decode_peers
        with tempfile.TemporaryDirectory() as temp:
            out = pathlib.Path(temp) / "peers.json"
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code = decode_peers.main(["--smoke", "--device", "cpu", "--dtype", "float32",
                                          "--json", str(out), *argv])
            report = json.loads(out.read_text())
            self.assertEqual(json.loads(stdout.getvalue()), report)
            return code, report

    def test_smoke_on_the_cpu(self):
        peers = ["eager", "cuda_graphs"] + (["hf_eager", "hf_static"] if HAVE_HF else [])
        code, report = self.run_peers("--peers", ",".join(peers))
        self.assertEqual(report["schema"], "replay.llm_decode.peers/1")
        self.assertEqual(code, 1)  # cuda_graphs cannot run on a CPU
        self.assertFalse(report["complete"])
        self.assertEqual(report["settings"]["steps"], 11)
        self.assertEqual(report["settings"]["context_buckets"], [16, 32, 64])
        self.assertEqual(report["model"]["config"]["hidden_size"], 64)
        self.assertEqual(list(report["peers"]), peers)
        graphs = report["peers"]["cuda_graphs"]
        self.assertEqual(graphs["status"], "failed")
        self.assertIn("needs a CUDA device", graphs["error"])
        self.assertEqual([r["status"] for r in graphs["results"]], ["skipped", "skipped"])
        self.assertTrue(any("cuda_graphs batch 1" in note for note in report["notes"]))
        for name in set(peers) - {"cuda_graphs"}:
            peer = report["peers"][name]
            self.assertEqual(peer["status"], "ok", peer)
            self.assertEqual([r["batch"] for r in peer["results"]], [1, 2])
            for result in peer["results"]:
                self.assertEqual(result["status"], "ok")
                self.assertGreater(result["ms_per_step"], 0)
                self.assertAlmostEqual(result["tokens_per_s"], result["batch"] * 1e3 / result["ms_per_step"])
                if name != "eager":  # float32 on the CPU: the same greedy tokens
                    self.assertEqual(result["token_agreement_vs_eager"], 1.0)
            if name.startswith("hf_"):
                self.assertEqual(len(peer["results"][0]["samples_generate_ms"]), 2)
            else:
                self.assertEqual(len(peer["results"][0]["samples_ms_per_step"]), 2)

    def test_budget_spent_skips_the_rest(self):
        code, report = self.run_peers("--peers", "eager", "--budget-s", "0")
        self.assertEqual(code, 1)
        self.assertEqual(report["peers"]["eager"]["status"], "skipped")
        self.assertIn("the run time budget was spent", report["peers"]["eager"]["error"])
        self.assertEqual([r["status"] for r in report["peers"]["eager"]["results"]], ["skipped", "skipped"])

    @NEED_COMPILE
    def test_budget_interrupts_a_peer_and_skips_the_rest(self):
        code, report = self.run_peers("--peers", "compile,eager", "--budget-s", "2")
        self.assertEqual(code, 1)
        compiled = report["peers"]["compile"]
        self.assertEqual(compiled["status"], "skipped")
        self.assertIn("the run time budget ran out while running", compiled["error"])
        self.assertEqual([r["status"] for r in compiled["results"]], ["skipped", "skipped"])
        self.assertEqual(report["peers"]["eager"]["status"], "skipped")
        self.assertLess(report["elapsed_s"], 30)

    @NEED_COMPILE
    def test_max_autotune_peer_compiles_in_its_mode_within_the_budget(self):
        code, report = self.run_peers("--peers", "compile_max_autotune", "--compile-budget-s", "1")
        self.assertEqual(code, 1)
        peer = report["peers"]["compile_max_autotune"]
        self.assertEqual(peer["details"]["mode"], "max-autotune")
        self.assertIn("max-autotune", peer["label"])
        self.assertIn("the compile time budget ran out while running", peer["results"][0]["error"])

    @NEED_COMPILE
    def test_compile_budget_interrupts_compilation(self):
        code, report = self.run_peers("--peers", "compile", "--compile-budget-s", "1")
        peer = report["peers"]["compile"]
        self.assertEqual([r["status"] for r in peer["results"]], ["skipped", "skipped"], peer)
        self.assertIn("the compile time budget ran out while running", peer["results"][0]["error"])
        self.assertIn("the compile time budget was spent before this batch", peer["results"][1]["error"])
        self.assertEqual(code, 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
