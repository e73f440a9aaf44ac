#!/usr/bin/env python3
"""Finds out whether (and how) AOTInductor packages load and run on this
machine: compiles a tiny model and ResNet-50 with
torch._inductor.aoti_compile_and_package, then loads and runs each package in
a fresh subprocess under `python -X faulthandler` (and, for a crash, once more
under gdb when it is installed, for the native backtrace), one variant at a
time:

  loader    torch._inductor.aoti_load_package | torch._export.aot_load (on the unpacked .so) |
            torch._C._aoti.AOTIModelPackageLoader (the C++ loader's binding)
  threads   run_single_threaded False | True
  device    device_index -1 (current) | 0
  compile   default | max_autotune (tiny model only unless --full) |
            dynamic batch (torch.export.Dim)
  device    a CPU package of the tiny model too (is it the loader, or CUDA?)
  imports   torch only | torch and torchvision

and prints a verdict per variant (OK with the max-abs-error / max|ref|
against eager, ERROR with the exception, CRASH with the signal and the
backtrace, TIMEOUT), then a summary table.

    python3 scripts/aoti_probe.py [--work DIR] [--full] [--timeout S] [--only REGEX] [--cpu-only]

Needs torch with CUDA (and torchvision for ResNet-50). Each step has its own
timeout; a default run takes a few minutes, mostly compilation.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


# ---------------------------------------------------------------------------
# child side: one step per process
# ---------------------------------------------------------------------------

def make_model(name, torch):
    if name == "tiny":
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16))
    if name == "resnet50":
        import torchvision
        torch.manual_seed(0)
        return torchvision.models.resnet50(weights=None)
    raise SystemExit(f"unknown model {name}")


def example_input(name, batch, torch):
    g = torch.Generator().manual_seed(1)
    if name == "tiny":
        return torch.randn(batch, 64, generator=g)
    return torch.randn(batch, 3, 224, 224, generator=g)


def child_compile(args):
    import torch
    dtype = torch.float16 if args.device == "cuda" else torch.float32
    model = make_model(args.model, torch).eval().to(args.device, dtype)
    x = example_input(args.model, 4, torch).to(args.device, dtype)
    dynamic_shapes = None
    if args.dynamic:
        batch = torch.export.Dim("batch", min=1, max=32)
        dynamic_shapes = ({0: batch},)
    start = time.perf_counter()
    with torch.inference_mode():
        exported = torch.export.export(model, (x,), dynamic_shapes=dynamic_shapes)
    options = {"max_autotune": True} if args.autotune else {}
    path = torch._inductor.aoti_compile_and_package(exported, package_path=args.package,
                                                    inductor_configs=options)
    with torch.inference_mode():
        ref = model(x).float().cpu()
    torch.save({"x": x.cpu(), "ref": ref}, args.package + ".ref")
    print(json.dumps({"package": path, "compile_s": time.perf_counter() - start,
                      "size_mb": os.path.getsize(path) / 2**20}))


def child_load(args):
    import torch
    if args.torchvision:
        import torchvision  # noqa: F401  (its ops library loaded too, as in a benchmark process)
    saved = torch.load(args.package + ".ref")
    x = saved["x"].to(args.device)
    ref = saved["ref"]
    print(f"loading {args.package} with {args.loader} single_threaded={args.single_threaded} "
          f"device_index={args.device_index}", flush=True)
    if args.loader == "aoti_load_package":
        runner = torch._inductor.aoti_load_package(args.package, run_single_threaded=args.single_threaded,
                                                   device_index=args.device_index)
        call = lambda t: runner(t)  # noqa: E731
    elif args.loader == "aot_load":
        # The older loader takes the model's shared library, not a package:
        # unpack the package (the .so with its kernel binaries) and load that.
        if not hasattr(torch._export, "aot_load"):
            raise RuntimeError("torch._export.aot_load does not exist in this torch")
        import zipfile
        unpacked = args.package + ".unpacked"
        with zipfile.ZipFile(args.package) as z:
            z.extractall(unpacked)
        libs = [os.path.join(d, f) for d, _, fs in os.walk(unpacked) for f in fs if f.endswith(".so")]
        if not libs:
            raise RuntimeError(f"no .so inside {args.package}")
        print(f"unpacked {libs[0]}", flush=True)
        runner = torch._export.aot_load(libs[0], args.device)
        call = lambda t: runner(t)  # noqa: E731
    elif args.loader == "cpp_loader":
        loader = torch._C._aoti.AOTIModelPackageLoader(args.package, "model", args.single_threaded, 1,
                                                       args.device_index)
        call = lambda t: loader.run([t])  # noqa: E731
    else:
        raise SystemExit(f"unknown loader {args.loader}")
    print("loaded", flush=True)
    with torch.inference_mode():
        out = call(x)
        if isinstance(out, (list, tuple)):
            out = out[0]
        if args.device == "cuda":
            torch.cuda.synchronize()
        print("ran", flush=True)
        if args.dynamic:  # another batch size through the same package
            y = torch.cat([x, x, x], 0)
            out3 = call(y)
            out3 = out3[0] if isinstance(out3, (list, tuple)) else out3
            if tuple(out3.shape)[0] != 3 * x.shape[0]:
                raise RuntimeError(f"dynamic batch: got shape {tuple(out3.shape)}")
    err = (out.float().cpu() - ref).abs().max().item()
    scale = ref.abs().max().item() or 1.0
    print(json.dumps({"rel_err": err / scale}))


# ---------------------------------------------------------------------------
# parent side
# ---------------------------------------------------------------------------

def run_child(argv, timeout):
    cmd = [sys.executable, "-X", "faulthandler", HERE, "--child"] + argv
    start = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc = "timeout"
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    return rc, out, err, time.perf_counter() - start, cmd


def last_json(text):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def describe_failure(rc, out, err):
    if rc == "timeout":
        return "TIMEOUT", err.strip().splitlines()[-5:]
    if isinstance(rc, int) and rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        trace = [l for l in err.splitlines() if l.strip()]
        # faulthandler's dump: "Fatal Python error: Segmentation fault" then the frames.
        start = next((i for i, l in enumerate(trace) if "Fatal Python error" in l), max(0, len(trace) - 30))
        return f"CRASH ({name})", trace[start:start + 40]
    lines = [l for l in err.splitlines() if l.strip()]
    return f"ERROR (rc={rc})", lines[-8:]


def gdb_backtrace(cmd, timeout):
    gdb = shutil.which("gdb")
    if not gdb:
        return ["(gdb not installed: no native backtrace)"]
    full = [gdb, "-q", "-batch", "-ex", "run", "-ex", "bt 40", "--args"] + cmd
    try:
        p = subprocess.run(full, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ["(gdb timed out)"]
    lines = p.stdout.splitlines()
    start = next((i for i, l in enumerate(lines) if "received signal" in l), None)
    return lines[start:start + 45] if start is not None else lines[-20:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.add_argument("--work", default="build/aoti_probe", help="where packages are written")
    parser.add_argument("--full", action="store_true", help="also max_autotune for ResNet-50 (slow)")
    parser.add_argument("--timeout", type=float, default=420, help="per compile step, seconds")
    parser.add_argument("--only", default="", help="only variants whose name matches this regex")
    parser.add_argument("--cpu-only", action="store_true", help="CPU packages only")
    args = parser.parse_args()

    if args.child is not None:
        cp = argparse.ArgumentParser()
        cp.add_argument("step", choices=["compile", "load"])
        cp.add_argument("--model", default="tiny")
        cp.add_argument("--package", required=True)
        cp.add_argument("--autotune", type=int, default=0)
        cp.add_argument("--dynamic", type=int, default=0)
        cp.add_argument("--loader", default="aoti_load_package")
        cp.add_argument("--single-threaded", type=int, default=0)
        cp.add_argument("--device-index", type=int, default=-1)
        cp.add_argument("--torchvision", type=int, default=0)
        cp.add_argument("--device", default="cuda")
        c = cp.parse_args(args.child)
        c.single_threaded = bool(c.single_threaded)
        return child_compile(c) if c.step == "compile" else child_load(c)

    try:
        import torch
    except ImportError:
        print("aoti_probe: needs torch", file=sys.stderr)
        return 1
    device = "cuda" if torch.cuda.is_available() and not args.cpu_only else "cpu"
    if device == "cpu" and not args.cpu_only:
        print("aoti_probe: no CUDA device: probing CPU packages only")
    try:
        import torchvision  # noqa: F401
        have_tv = True
    except ImportError:
        have_tv = False
    gpu = torch.cuda.get_device_name() if device == "cuda" else "no GPU"
    print(f"aoti_probe: torch {torch.__version__}, CUDA {torch.version.cuda}, {gpu}, "
          f"python {sys.version.split()[0]}, gcc {shutil.which('gcc') or 'none'}")
    os.makedirs(args.work, exist_ok=True)

    # (model, max_autotune, dynamic batch, device): a CPU package too, to tell
    # a crash of CUDA packages from one of the package loader itself.
    builds = [("tiny", 0, 0, "cpu")]
    if device == "cuda":
        builds += [("tiny", 0, 0, "cuda"), ("tiny", 1, 0, "cuda"), ("tiny", 0, 1, "cuda")]
        if have_tv:
            builds += [("resnet50", 0, 0, "cuda"), ("resnet50", 0, 1, "cuda")]
            if args.full:
                builds.append(("resnet50", 1, 0, "cuda"))
        else:
            print("(torchvision not installed: ResNet-50 is skipped)")
    only = re.compile(args.only) if args.only else None
    results = []
    for model, autotune, dynamic, dev in builds:
        tag = f"{model}-{dev}{'-autotune' if autotune else ''}{'-dynamic' if dynamic else ''}"
        package = os.path.abspath(os.path.join(args.work, tag + ".pt2"))
        loads = [("aoti_load_package", 0, -1, 0), ("aoti_load_package", 1, -1, 0), ("cpp_loader", 0, -1, 0),
                 ("aot_load", 0, -1, 0)]
        if dev == "cuda":
            loads.append(("aoti_load_package", 0, 0, 0))
        if model == "resnet50":
            loads.append(("aoti_load_package", 0, -1, 1))
        names = [f"{tag} {l} st={s} dev={d}{' +torchvision' if tv else ''}" for l, s, d, tv in loads]
        if only and not any(only.search(n) for n in names):
            continue
        print(f"\n== compile {tag}", flush=True)
        rc, out, err, secs, cmd = run_child(["compile", "--model", model, "--package", package, "--device", dev,
                                             "--autotune", str(autotune), "--dynamic", str(dynamic)], args.timeout)
        info = last_json(out) if rc == 0 else None
        if info is None:
            verdict, lines = describe_failure(rc, out, err)
            print(f"   compile {tag}: {verdict} after {secs:.0f} s")
            for l in lines:
                print(f"     | {l}")
            results.append((f"{tag} (compile)", verdict, ""))
            continue
        print(f"   compiled in {info['compile_s']:.0f} s, {info['size_mb']:.1f} MiB")
        for (loader, single, device, tv), name in zip(loads, names):
            if only and not only.search(name):
                continue
            argv = ["load", "--model", model, "--package", package, "--loader", loader,
                    "--single-threaded", str(single), "--device-index", str(device), "--dynamic", str(dynamic),
                    "--torchvision", str(tv), "--device", dev]
            rc, out, err, secs, cmd = run_child(argv, 180)
            data = last_json(out) if rc == 0 else None
            if data is not None:
                verdict = "OK"
                detail = f"rel.err {data['rel_err']:.1e}"
                print(f"   {name}: OK ({detail}, {secs:.1f} s)")
            else:
                verdict, lines = describe_failure(rc, out, err)
                progress = [l for l in out.splitlines() if l in ("loaded", "ran")]
                detail = f"after '{progress[-1]}'" if progress else "while loading"
                print(f"   {name}: {verdict} {detail} ({secs:.1f} s)")
                for l in lines:
                    print(f"     | {l}")
                if verdict.startswith("CRASH"):
                    print("     native backtrace (gdb):")
                    for l in gdb_backtrace(cmd, 240):
                        print(f"     # {l}")
            results.append((name, verdict, detail))

    print("\n================ aoti_probe summary ================")
    for name, verdict, detail in results:
        print(f"  {verdict:16} {name}  {detail}")
    ok = sum(1 for _, v, _ in results if v == "OK")
    print(f"  {ok} of {len(results)} variants loaded and ran correctly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
