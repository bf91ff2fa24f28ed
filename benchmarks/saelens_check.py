"""SAELens opens glassformer's SAEs, and glassformer opens SAELens's: the same features and
reconstructions, checked with SAELens itself.

SAELens pins TransformerLens 3, which the test extra's TransformerLens 4 excludes, so it
lives in a Python of its own, passed in by path (a peer outside the repository):

    python -m venv /tmp/saelens && /tmp/saelens/bin/pip install torch==2.13.0 sae-lens
    python benchmarks/saelens_check.py --sae-lens /tmp/saelens/bin/python [--sae runs/sae]

Both ways: (1) the glassformer SAE (--sae, a `train sae` run or its checkpoint; by default a
random TopK one with uneven decoder rows) is loaded by ``sae_lens.SAE.load_from_disk`` and both
encode and decode the same activations; (2) SAELens makes a random TopK SAE, saves it with
``save_model``, and glassformer opens that directory. Prints the largest differences.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from glassformer import SAEConfig, SparseAutoencoder

THEIRS = r"""
import json, sys, torch
from sae_lens import SAE
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig
work = sys.argv[1]
sae = SAE.load_from_disk(work + "/ours", device="cpu")
x = torch.load(work + "/x.pt")
z = sae.encode(x)
torch.save({"features": z.detach(), "reconstruction": sae.decode(z).detach()}, work + "/theirs.pt")
torch.manual_seed(1)
made = TopKSAE(TopKSAEConfig(d_in=x.shape[1], d_sae=4 * x.shape[1], k=16))
with torch.no_grad():
    for p in made.parameters():
        p.normal_(0, 0.1)
made.save_model(work + "/made")
y = torch.randn(64, x.shape[1])
z = made.encode(y)
torch.save({"x": y, "features": z.detach(), "reconstruction": made.decode(z).detach()},
           work + "/made.pt")
print(json.dumps({"class": type(sae).__name__, "k": sae.cfg.k,
                  "hook": sae.cfg.metadata.hook_name}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sae-lens", required=True, help="a Python with sae_lens installed")
    parser.add_argument("--sae", help="a glassformer SAE run (default: a random one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        ours = _ours(args.sae)
        ours.save_pretrained(Path(work) / "ours")
        torch.manual_seed(0)
        x = torch.randn(256, ours.config.d_in) * 3 + ours.b_dec.detach()
        torch.save(x, Path(work) / "x.pt")
        done = subprocess.run([args.sae_lens, "-c", THEIRS, work], capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"SAELens failed:\n{done.stderr[-3000:]}")
        said = json.loads(done.stdout.strip().splitlines()[-1])
        theirs = torch.load(Path(work) / "theirs.pt")
        with torch.no_grad():
            mine = ours(x)
        print(f"SAELens opened glassformer's SAE as {said['class']} (k={said['k']}, "
              f"hook {said['hook']!r})")  # fmt: skip
        print(
            f"  features: largest difference {_gap(mine.features, theirs['features']):.2e}, "
            f"the same active set: {torch.equal(mine.features > 0, theirs['features'] > 0)}"
        )
        print(f"  reconstruction: largest difference "
              f"{_gap(mine.reconstruction, theirs['reconstruction']):.2e}")  # fmt: skip
        made = SparseAutoencoder.from_pretrained(Path(work) / "made")
        reference = torch.load(Path(work) / "made.pt")
        with torch.no_grad():
            again = made(reference["x"])
        print(f"glassformer opened SAELens's saved TopK SAE (k={made.config.k}):")
        print(f"  features: largest difference {_gap(again.features, reference['features']):.2e}")
        print(f"  reconstruction: largest difference "
              f"{_gap(again.reconstruction, reference['reconstruction']):.2e}")  # fmt: skip


def _ours(path: str | None) -> SparseAutoencoder:
    if path:
        return SparseAutoencoder.from_pretrained(path)
    torch.manual_seed(0)
    config = SAEConfig(d_in=64, d_sae=256, k=8, rescale_acts_by_decoder_norm=True,
                       hook_name="blocks.3.hook_resid_post", model_name="random")  # fmt: skip
    sae = SparseAutoencoder(config)
    with torch.no_grad():
        sae.W_dec.mul_(torch.rand(256, 1) * 3 + 0.2)
        sae.b_dec.add_(torch.randn(64))
        sae.b_enc.add_(torch.randn(256) * 0.1)
    return sae


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


if __name__ == "__main__":
    main()
