"""Keeping freed memory: a freed 64 MB tensor's pages are mostly reused, not faulted in again."""

import subprocess
import sys

import pytest

CHILD = """
import resource, sys, torch
from glassformer.training.memory import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "keep" else False
torch.empty(16 * 2**20).fill_(1.0)  # 64 MB: over glibc's default mmap threshold
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    torch.empty(16 * 2**20).fill_(1.0)
print(took, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 5)
"""


def faults_per_allocation(kind: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, kind], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    took, kept = faults_per_allocation("keep")
    _, default = faults_per_allocation("default")
    assert took == "True"
    assert default > 8000  # 16,384 pages of 4 KiB, handed back and faulted in every time
    assert kept <= default // 2  # most come from the kept heap (the medium GPT's training
    # step: 32,000 faults with glibc's defaults, 500 kept; benchmarks/malloc.py)
