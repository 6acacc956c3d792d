"""Write the UCI handwritten digits that ship inside scikit-learn as a CSV (no download).

    python scripts/make_digits.py OUT_DIR

Writes ``OUT_DIR/digits.csv`` with columns ``pixel_0 .. pixel_63`` (0..16) and ``label`` (0..9),
1,797 real rows. The file is written to a temp name and renamed, and left alone when its
content would not change, so prep's fingerprint cache stays warm across demo runs.
"""

from __future__ import annotations

import csv
import io
import os
import sys
from pathlib import Path


def digits_csv() -> str:
    """The digits data set as CSV text."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([f"pixel_{i}" for i in range(digits.data.shape[1])] + ["label"])
    for row, label in zip(digits.data, digits.target):
        writer.writerow([int(v) for v in row] + [int(label)])
    return buf.getvalue()


def main(out_dir: str) -> int:
    target = Path(out_dir) / "digits.csv"
    text = digits_csv()
    if target.exists() and target.read_text() == text:
        print(f"digits data unchanged: {target}")
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".csv.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)
    print(f"wrote {text.count(chr(10)) - 1} digits rows to {target}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/make_digits.py OUT_DIR")
    sys.exit(main(sys.argv[1]))
