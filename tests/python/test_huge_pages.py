"""Large tensors on transparent huge pages (util/malloc_policy.h): the engine asks LibTorch's CPU allocator to advise
blocks of 2 MB and more MADV_HUGEPAGE, which the kernel shows as the flag `hg` in the mapping's VmFlags
(/proc/PID/smaps). Checked on a running `archspace serve` holding a tiny model with the dolma2 vocabulary (its
embedding and head are 25 MB each): advised by default, and not with THP_MEM_ALLOC_ENABLE=0, the user's way out.
Whether the kernel then backs them with huge pages depends on its free memory; the advice is what the engine does."""
import pathlib

import pytest

from test_serve import Server, model_dir  # noqa: F401 (the fixture)

THP = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")

pytestmark = pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(),
                                reason="this kernel has no transparent huge pages to ask for")


def advised_mappings(pid):
    """The VmFlags lines of the process's mappings that carry `hg` (MADV_HUGEPAGE)."""
    smaps = pathlib.Path(f"/proc/{pid}/smaps").read_text()
    return [line for line in smaps.splitlines() if line.startswith("VmFlags:") and " hg" in line + " "]


def test_large_tensors_are_advised_onto_huge_pages(model_dir, monkeypatch):  # noqa: F811
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    server = Server(model_dir[0])
    try:
        assert advised_mappings(server.proc.pid), "no mapping of serve's is advised MADV_HUGEPAGE"
    finally:
        assert server.stop() == 0


def test_the_user_can_turn_it_off(model_dir, monkeypatch):  # noqa: F811
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    server = Server(model_dir[0])
    try:
        assert advised_mappings(server.proc.pid) == []
    finally:
        assert server.stop() == 0
