#!/usr/bin/env python3
"""Writes a BERT-base-sized encoder (transformers.BertConfig() defaults: 12
layers, hidden 768, 12 heads; random weights, nothing is downloaded) as
TorchScript, with reference inputs and outputs, for the torch_bert example.

    python3 scripts/make_torchscript_bert.py OUT_DIR [--device cuda] [--dtype fp16]
                                             [--shapes 1x16,8x128,...] [--seed N]

Writes OUT_DIR/bert_torchscript.pt, traced on the device in the dtype (so that
the constants the trace records, such as the attention mask's fill value and
dtype, are right for it), taking (input_ids, attention_mask), both int64
[batch, sequence], and returning (last_hidden_state, pooler_output); and
OUT_DIR/bert_reference.pt, a TorchScript module whose buffers hold, for each
shape, the inputs (ids_K, mask_K: random lengths per row, row 0 full, ids 0
where the mask is 0) and the outputs of the transformers model itself run
eagerly in the dtype (hidden_K, pooled_K) and in fp32 (hidden32_K,
pooled32_K). The traced model is checked against the eager one at every
shape first: a trace that baked a shape in would disagree.

With --readback it also writes OUT_DIR/bert_readback.pt, the same weights with
a read-back after layer READBACK_AFTER (6): a scripted module around two
traced halves, `if float(h.abs().max()) > 1e4: h = h.clamp(-1e4, 1e4)` between
them (TorchScript control flow, which a trace cannot hold), checked against
the eager model at every shape too; bench/torch_piecewise_bench.cpp --bert
graphs it piecewise against a whole graph of bert_torchscript.pt.
"""
import argparse
import os
import sys
import time
import warnings

DEFAULT_SHAPES = "1x16,1x128,2x20,3x37,4x64,5x100,8x16,8x128"
READBACK_AFTER = 6


def parse_shapes(text):
    out = []
    for part in text.split(","):
        b, s = part.lower().split("x")
        out.append((int(b), int(s)))
    return out


def make_read_back(torch, model, example, after):
    """The encoder with `if float(h.abs().max()) > 1e4: h = h.clamp(...)` after
    layer `after`: two traced halves (embeddings and layers [0, after); layers
    [after, end) and the pooler) inside a scripted module, whose branch on the
    read-back is TorchScript control flow."""

    def run_layers(layers, h, extended):
        for layer in layers:
            out = layer(h, attention_mask=extended)
            h = out[0] if isinstance(out, tuple) else out
        return h

    class First(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = model.embeddings
            self.layers = torch.nn.ModuleList(model.encoder.layer[:after])

        def forward(self, input_ids, attention_mask):
            h = self.embeddings(input_ids=input_ids)
            # BertModel's additive mask (get_extended_attention_mask).
            extended = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
            return run_layers(self.layers, h, extended), extended

    class Second(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(model.encoder.layer[after:])
            self.pooler = model.pooler

        def forward(self, h, extended):
            h = run_layers(self.layers, h, extended)
            return h, self.pooler(h)

    class ReadBack(torch.nn.Module):
        def __init__(self, first, second):
            super().__init__()
            self.first = first
            self.second = second

        def forward(self, input_ids, attention_mask):
            h, extended = self.first(input_ids, attention_mask)
            if float(h.abs().max()) > 10000.0:
                h = h.clamp(-10000.0, 10000.0)
            return self.second(h, extended)

    first = First().eval()
    second = Second().eval()
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced_first = torch.jit.trace(first, example, check_trace=False, strict=False)
        traced_second = torch.jit.trace(second, first(*example), check_trace=False, strict=False)
        return torch.jit.script(ReadBack(traced_first, traced_second))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=["fp16", "fp32"], default="fp16")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="reference shapes, BATCHxSEQ,...")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers (for a quick check)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--readback", action="store_true",
                        help=f"also write bert_readback.pt (a read-back after layer {READBACK_AFTER})")
    args = parser.parse_args()
    start = time.perf_counter()
    try:
        import torch
        import transformers
        from transformers import BertConfig, BertModel
    except ImportError as exc:
        print(f"make_torchscript_bert: needs torch and transformers ({exc})", file=sys.stderr)
        return 1
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("make_torchscript_bert: no CUDA device", file=sys.stderr)
        return 1
    dtype = torch.float16 if args.dtype == "fp16" else torch.float32
    device = torch.device(args.device)

    torch.manual_seed(args.seed)
    config = BertConfig() if args.layers is None else BertConfig(num_hidden_layers=args.layers)
    model32 = BertModel(config).eval().to(device)
    model = BertModel(config).eval()
    model.load_state_dict(model32.state_dict())
    model = model.to(device, dtype)

    class Encoder(torch.nn.Module):
        """(input_ids, attention_mask) -> (last_hidden_state, pooler_output), as tensors for tracing."""

        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
            return out[0], out[1]

    gen = torch.Generator().manual_seed(args.seed + 1)

    def make_inputs(batch, seq):
        ids = torch.randint(1, config.vocab_size, (batch, seq), generator=gen)
        lengths = torch.randint(1, seq + 1, (batch,), generator=gen)
        lengths[0] = seq
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        return (ids * mask).to(device), mask.to(device)

    encoder = Encoder(model).eval()
    # The example has padding: a trace of an all-ones mask could drop the mask.
    example = make_inputs(2, 24)
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(encoder, example, check_trace=False, strict=False)

    read_back = None
    if args.readback:
        read_back = make_read_back(torch, model, example, min(READBACK_AFTER, config.num_hidden_layers))
    shapes = parse_shapes(args.shapes)
    buffers = {}
    worst = 0.0
    with torch.no_grad():
        for k, (batch, seq) in enumerate(shapes):
            ids, mask = make_inputs(batch, seq)
            hidden, pooled = encoder(ids, mask)
            t_hidden, t_pooled = traced(ids, mask)
            keep = mask[..., None].to(hidden.dtype)  # padded positions are not compared
            err = max(((t_hidden - hidden) * keep).abs().max().item(), (t_pooled - pooled).abs().max().item())
            scale = max(hidden.abs().max().item(), pooled.abs().max().item())
            worst = max(worst, err / scale)
            if err / scale > 1e-2:
                print(f"make_torchscript_bert: the trace differs from eager at {batch}x{seq}: "
                      f"max-abs-error / max|ref| = {err / scale:.2e}", file=sys.stderr)
                return 1
            if read_back is not None:
                r_hidden, r_pooled = read_back(ids, mask)
                r_err = max(((r_hidden - hidden) * keep).abs().max().item(), (r_pooled - pooled).abs().max().item())
                if r_err / scale > 1e-2:
                    print(f"make_torchscript_bert: the read-back model differs from eager at {batch}x{seq}: "
                          f"max-abs-error / max|ref| = {r_err / scale:.2e}", file=sys.stderr)
                    return 1
            hidden32, pooled32 = model32(input_ids=ids, attention_mask=mask)[:2]
            buffers.update({f"ids_{k}": ids, f"mask_{k}": mask, f"hidden_{k}": hidden, f"pooled_{k}": pooled,
                            f"hidden32_{k}": hidden32, f"pooled32_{k}": pooled32})

    os.makedirs(args.out_dir, exist_ok=True)
    model_path = os.path.join(args.out_dir, "bert_torchscript.pt")
    traced.save(model_path)

    class Reference(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for name, tensor in buffers.items():
                self.register_buffer(name, tensor.detach().cpu().contiguous())
            self.register_buffer("count", torch.tensor([len(shapes)]))

        def forward(self):
            return self.count

    if read_back is not None:
        read_back.save(os.path.join(args.out_dir, "bert_readback.pt"))
    ref_path = os.path.join(args.out_dir, "bert_reference.pt")
    torch.jit.script(Reference()).save(ref_path)
    size_mb = os.path.getsize(model_path) / 2**20
    print(f"make_torchscript_bert: wrote {model_path} ({size_mb:.0f} MiB, {config.num_hidden_layers} layers, "
          f"{args.dtype} on {device}, attention {model.config._attn_implementation}) and {ref_path} "
          f"({len(shapes)} shapes; trace vs eager max-abs-error / max|ref| {worst:.1e})"
          f"{'' if read_back is None else ' and bert_readback.pt (a read-back after layer %d)' % READBACK_AFTER}; "
          f"torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
