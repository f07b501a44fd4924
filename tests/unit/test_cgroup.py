"""The memory limit read from the process's cgroup, on the layouts the kernel and the container
runtimes write: v2 with and without a cgroup namespace, v1 as containerd mounts it, hybrid,
no limit, and what cannot be read. Real files in a temporary tree, read by the real code."""

from __future__ import annotations

from pathlib import Path

from controller.cgroup import memory_limit
from controller.exporter import MemoryLimitCollector

MI = 1024 * 1024
V1_NONE = "9223372036854771712"  # what v1 writes for no limit on 4 KiB pages


def tree(root: Path, own: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A cgroup mount at ``root/fs`` holding ``files`` (path → content), and a
    ``/proc/self/cgroup`` that reads ``own``."""
    for path, text in files.items():
        where = root / "fs" / path
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(text + "\n")
    (root / "cgroup").write_text(own)
    return root / "fs", root / "cgroup"


def test_v2_in_its_own_namespace_reads_the_mount_root(tmp_path: Path) -> None:
    mount, own = tree(tmp_path, "0::/\n", {"memory.max": str(256 * MI)})
    assert memory_limit(mount, own) == 256 * MI


def test_v2_without_a_limit_is_none(tmp_path: Path) -> None:
    mount, own = tree(tmp_path, "0::/\n", {"memory.max": "max"})
    assert memory_limit(mount, own) is None


def test_v2_the_least_limit_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    """A pod's limit on the parent binds a container that has none of its own, and the
    tighter of two wins whichever level holds it."""
    files = {
        "kubepods/pod1/memory.max": str(512 * MI),
        "kubepods/pod1/ctr/memory.max": "max",
    }
    mount, own = tree(tmp_path, "0::/kubepods/pod1/ctr\n", files)
    assert memory_limit(mount, own) == 512 * MI
    files["kubepods/pod1/ctr/memory.max"] = str(300 * MI)
    mount, own = tree(tmp_path, "0::/kubepods/pod1/ctr\n", files)
    assert memory_limit(mount, own) == 300 * MI


def test_v1_without_a_namespace_reads_the_container_s_mount_root(tmp_path: Path) -> None:
    """containerd on a v1 node: /proc/self/cgroup names the host's path, which the container's
    memory mount does not hold; its root is the container's own cgroup."""
    own_text = "12:pids:/kubepods/x\n4:memory:/kubepods/burstable/pod9/abc\n1:name=systemd:/\n"
    mount, own = tree(tmp_path, own_text, {"memory/memory.limit_in_bytes": str(256 * MI)})
    assert memory_limit(mount, own) == 256 * MI


def test_v1_no_limit_reads_as_none(tmp_path: Path) -> None:
    mount, own = tree(tmp_path, "4:memory:/\n", {"memory/memory.limit_in_bytes": V1_NONE})
    assert memory_limit(mount, own) is None


def test_hybrid_reads_the_v1_memory_hierarchy(tmp_path: Path) -> None:
    """Hybrid mode: v1 holds the memory controller, the unified hierarchy has none."""
    files = {"memory/memory.limit_in_bytes": str(128 * MI), "unified/memory.max": str(MI)}
    mount, own = tree(tmp_path, "0::/\n4:memory:/\n", files)
    assert memory_limit(mount, own) == 128 * MI


def test_what_cannot_be_read_is_none_never_an_error(tmp_path: Path) -> None:
    assert memory_limit(tmp_path / "nothing", tmp_path / "no-such-file") is None
    mount, own = tree(tmp_path, "0::/../../etc\n", {"memory.max": "lots"})
    assert memory_limit(mount, own) is None
    (tmp_path / "binary").write_bytes(b"\xff\xfe")
    assert memory_limit(mount, tmp_path / "binary") is None


def test_exported_where_set_and_absent_where_not(tmp_path: Path) -> None:
    mount, own = tree(tmp_path, "0::/\n", {"memory.max": str(256 * MI)})
    families = list(MemoryLimitCollector(lambda: memory_limit(mount, own)).collect())
    assert [(f.name, [s.value for s in f.samples]) for f in families] == [
        ("weight_controller_memory_limit_bytes", [256 * MI])
    ]
    (mount / "memory.max").write_text("max\n")  # resized in place to no limit
    assert list(MemoryLimitCollector(lambda: memory_limit(mount, own)).collect()) == []
