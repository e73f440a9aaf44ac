"""Runs bench/llm_decode/summarize.py on made-up reports, for its tests
(summarize_*_test.py): each report is written to a file of its own in a
temporary folder, passed with its option, and the printed text returned."""
import json
import pathlib
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "llm_decode" / "summarize.py"


def summarize(cpp=None, peers=(), goodput=(), pairs=()):
    """cpp: a `llm_decode bench --json` report or None; peers, goodput: lists of
    `decode_peers.py --json` and `llm_decode goodput --json` reports; pairs:
    (bench report, [peers reports]) for --pair. The files are named
    peers<i>.json, run<i + 1>.json and pair<i>_cpp.json / pair<i>_peers<j>.json,
    as the output names them."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        args = [sys.executable, str(SCRIPT)]
        if cpp is not None:
            (folder / "cpp.json").write_text(json.dumps(cpp))
            args += ["--cpp", str(folder / "cpp.json")]
        if peers:
            args.append("--peers")
            for i, report in enumerate(peers):
                (folder / f"peers{i}.json").write_text(json.dumps(report))
                args.append(str(folder / f"peers{i}.json"))
        for i, (bench, reports) in enumerate(pairs):
            (folder / f"pair{i}_cpp.json").write_text(json.dumps(bench))
            args += ["--pair", str(folder / f"pair{i}_cpp.json")]
            for j, report in enumerate(reports):
                (folder / f"pair{i}_peers{j}.json").write_text(json.dumps(report))
                args.append(str(folder / f"pair{i}_peers{j}.json"))
        for i, report in enumerate(goodput):
            (folder / f"run{i + 1}.json").write_text(json.dumps(report))
            args += ["--goodput", str(folder / f"run{i + 1}.json")]
        return subprocess.run(args, capture_output=True, text=True, check=True).stdout
