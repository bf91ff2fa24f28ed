"""SAELens opens glassformer's transcoders, and glassformer opens SAELens's: the same
outputs, checked with SAELens itself (its own Python, as benchmarks/saelens_check.py):

    python -m venv /tmp/saelens && /tmp/saelens/bin/pip install torch==2.13.0 sae-lens
    python benchmarks/saelens_transcoders_check.py --sae-lens /tmp/saelens/bin/python

Both ways, for a ReLU skip set and a JumpReLU one: (1) a random glassformer set is written
with ``write_saelens_transcoders`` and each layer loaded by ``sae_lens.SAE.load_from_disk``;
both predict the MLP outputs of the same inputs; (2) SAELens makes one transcoder of each
architecture and saves it with ``save_model``; ``read_saelens_transcoders`` opens the folder.
Prints the largest differences.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from glassformer import TranscoderConfig, Transcoders
from glassformer.interop import read_saelens_transcoders, write_saelens_transcoders

THEIRS = r"""
import json, sys, torch
from sae_lens import SAE
from sae_lens.saes.transcoder import (JumpReLUTranscoder, JumpReLUTranscoderConfig,
                                      SkipTranscoder, SkipTranscoderConfig)
work = sys.argv[1]
x = torch.load(work + "/x.pt")
out = {}
for kind in ("skip", "jumprelu"):
    for layer in (0, 1):
        sae = SAE.load_from_disk(f"{work}/{kind}/blocks.{layer}", device="cpu")
        out[f"{kind}{layer}"] = sae(x[layer]).detach()
torch.manual_seed(1)
sizes = dict(d_in=16, d_out=16, d_sae=40, apply_b_dec_to_input=False)
for name, made in (("skip_made", SkipTranscoder(SkipTranscoderConfig(**sizes))),
                   ("jump_made", JumpReLUTranscoder(JumpReLUTranscoderConfig(**sizes)))):
    with torch.no_grad():
        for p in made.parameters():
            p.normal_(0, 0.3)
    made.cfg.metadata.hook_name = "blocks.0.ln2.hook_normalized"
    made.cfg.metadata.hook_name_out = "blocks.0.hook_mlp_out"
    made.save_model(f"{work}/{name}/blocks.0")
    out[name] = made(x[0]).detach()
torch.save(out, work + "/theirs.pt")
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sae-lens", required=True, help="a Python with sae-lens installed")
    args = p.parse_args()
    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp())
    x = torch.randn(2, 64, 16)
    torch.save(x, work / "x.pt")
    ours = {}
    for kind, architecture, skip in (("skip", "relu", True), ("jumprelu", "jumprelu", False)):
        tc = Transcoders(TranscoderConfig(d_model=16, d_transcoder=40, layers=(0, 1),
                                          architecture=architecture, skip=skip))  # fmt: skip
        with torch.no_grad():
            for param in tc.parameters():
                param.normal_(0, 0.3)
            if architecture == "jumprelu":
                tc.threshold.uniform_(0, 0.2)
            ours[kind] = tc(x).outputs
        write_saelens_transcoders(tc, work / kind)
    done = subprocess.run([args.sae_lens, "-c", THEIRS, str(work)], capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode:
        print(done.stderr[-3000:], file=sys.stderr)
        return 1
    theirs = torch.load(work / "theirs.pt")
    report = {}
    for kind in ("skip", "jumprelu"):
        for layer in (0, 1):
            report[f"SAELens reads glassformer's {kind} layer {layer}"] = float(
                (theirs[f"{kind}{layer}"] - ours[kind][layer]).abs().max()
            )
    for name in ("skip_made", "jump_made"):
        read = read_saelens_transcoders(work / name)
        with torch.no_grad():
            mine = read(x[:1]).outputs[0]
        report[f"glassformer reads SAELens's {name}"] = float((mine - theirs[name]).abs().max())
    print(json.dumps(report, indent=1))
    return 0 if max(report.values()) < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
