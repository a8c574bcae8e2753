"""Give records from before ``seq_lens`` the padded length of each micro-batch, rebuilt from their own recipe.

    python scripts/rebuild_seq_lens.py reference_results/h200-141gb.jsonl [--check]

Why: the steady time apart from first-seen sequence lengths (``iteration_times.length_split``) needs each
micro-batch's padded length, which runs record since ``seq_lens`` was added; the H200 records are older. Their
micro-batches are deterministic: the generated Alpaca2k-like data, the lab's tokenizer, litgpt's JSON data module
and quick mode's sampler (``quick_mode.batch_sampler``) give them again. A record gets ``seq_lens`` only where the
rebuilt micro-batches' own token counts equal every per-iteration token count it logged (exact, or nothing), and
its ``reference_note`` says they were rebuilt. Records that already have ``seq_lens``, or do not rebuild (another
data set: the H100's real Alpaca2k, a CPU run's data), are left as they are. The file is rewritten in place,
atomically; ``--check`` only prints what it would do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REBUILT_NOTE = "seq_lens rebuilt from the recipe by scripts/rebuild_seq_lens.py (token counts checked exact)"


def sample_lengths(record: dict[str, Any], workdir: Path) -> list[int]:
    """The tokenized length of every training sample of the record's data, as its run's litgpt data module had them."""
    from litgpt.data import JSON
    from litgpt.tokenizer import Tokenizer

    from lab_helpers.assets import make_alpaca_json
    from lab_helpers.assets.tokenizer import write_tokenizer_files

    config, train = record["config"], record["config"]["train"]
    data_args = dict(config["data"]["init_args"])
    if Path(data_args.pop("json_path")).name != "alpaca2k_like.json":
        raise ValueError("not the generated Alpaca2k-like data (only random-weights runs rebuild)")
    tokenizer_dir = workdir / "tokenizer"
    if not tokenizer_dir.exists():
        tokenizer_dir.mkdir(parents=True)
        write_tokenizer_files(tokenizer_dir)
    json_path = workdir / "alpaca2k_like.json"
    if not json_path.exists():
        make_alpaca_json(json_path, n_samples=2000, lengths="alpaca2k")
    data = JSON(json_path=json_path, **{**data_args, "num_workers": 0})
    data.connect(Tokenizer(tokenizer_dir), batch_size=train["micro_batch_size"], max_seq_length=train["max_seq_length"])
    data.setup()
    return [len(item["input_ids"]) for item in data.train_dataset]


def rebuilt_seq_lens(record: dict[str, Any], workdir: Path) -> tuple[list[int] | None, str]:
    """(padded length of each micro-batch in the order the run drew them, "") or (None, why not)."""
    from lab_helpers.training.quick_mode import batch_sampler

    if record.get("mode") != "quick":
        return None, "not a quick run (a full run's order is litgpt's own shuffle)"
    try:
        lengths = sample_lengths(record, workdir)
    except (KeyError, TypeError, ValueError) as err:
        return None, str(err)
    train = record["config"]["train"]
    ranks = int(record.get("simulated_world_size") or record.get("world_size") or 1)
    micro = int(train["micro_batch_size"])
    accumulation = max(1, int(train["global_batch_size"]) // (micro * ranks))
    sampler = batch_sampler(
        lengths, batch_order=record.get("batch_order") or "shuffle", batch_size=micro, accumulation=accumulation,
        world_size=ranks,
    )  # fmt: skip
    batches = list(sampler)
    logged = [row.get("tokens") for row in record.get("per_iteration") or []]
    if not logged or None in logged:
        return None, "no per-iteration token counts to check against"
    counts = [b - a for a, b in zip([0, *logged], logged, strict=False)]
    rebuilt = [sum(lengths[i] for i in batch) for batch in batches[: len(counts)]]
    if rebuilt != counts:
        return None, "the rebuilt micro-batches' token counts differ from the logged ones"
    return [max(lengths[i] for i in batch) for batch in batches[: len(counts)]], ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path, help="a .jsonl of records (a shipped reference file)")
    parser.add_argument("--check", action="store_true", help="say what would change; write nothing")
    args = parser.parse_args(argv)
    lines = args.records.read_text().splitlines()
    out, changed = [], 0
    with tempfile.TemporaryDirectory(prefix="seq-lens-") as tmp:
        for line in lines:
            record = json.loads(line) if line.strip() else None
            if record is None or record.get("seq_lens") or record.get("status") != "ok":
                out.append(line)
                continue
            seq_lens, why = rebuilt_seq_lens(record, Path(tmp))
            name = f"{record.get('experiment')} {record.get('run_id')}"
            if seq_lens is None:
                print(f"{name}: left as it is ({why})")
                out.append(line)
                continue
            record["seq_lens"] = seq_lens
            note = record.get("reference_note") or ""
            record["reference_note"] = f"{note}; {REBUILT_NOTE}" if note else REBUILT_NOTE
            print(f"{name}: seq_lens rebuilt, {len(seq_lens)} micro-batches, {len(set(seq_lens))} distinct lengths")
            out.append(json.dumps(record))
            changed += 1
    if changed and not args.check:
        fd, tmp_path = tempfile.mkstemp(dir=args.records.parent, prefix=".rebuild-")
        with os.fdopen(fd, "w") as fh:
            fh.write("\n".join(out) + "\n")
        os.replace(tmp_path, args.records)
    print(f"{changed} of {len(lines)} records {'would get' if args.check else 'got'} seq_lens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
