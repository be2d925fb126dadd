"""What the kernels' policies and the benchmark need to know of the machine: the size of its L3, its CPU's
vendor, how many CPUs this process may use, how much memory it can have, and, for the benchmark's report,
which CPU and caches the numbers come from."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
L3_SIZE_FILE = CACHE_DIR / "index3" / "size"
CPUINFO = Path("/proc/cpuinfo")
MEMINFO = Path("/proc/meminfo")
# When the size cannot be read (not Linux, no L3 listed): the L3 of one core complex of a current server.
DEFAULT_L3_BYTES = 32 * 2**20


def l3_bytes(size_file: Path = L3_SIZE_FILE) -> int:
    """The L3 size the OS reports for CPU 0 ("32768K" in sysfs), or ``DEFAULT_L3_BYTES``.

    In a VM this can be a whole socket's L3, shared with other tenants (260 MiB on one of ours)."""
    try:
        text = size_file.read_text().strip()
        return int(text[:-1]) * {"K": 2**10, "M": 2**20}[text[-1]]
    except (OSError, ValueError, KeyError, IndexError):
        return DEFAULT_L3_BYTES


def cache_sizes(cache_dir: Path = CACHE_DIR) -> str:
    """CPU 0's caches as sysfs lists them, "L1d 48K, L1i 32K, L2 1024K, L3 32768K", or "" where it lists none."""
    found = []
    for index in sorted(cache_dir.glob("index*")):
        try:
            level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        found.append(f"L{level}{suffix} {size}")
    return ", ".join(found)


def cpu_identity(cpuinfo: Path = CPUINFO) -> dict[str, str]:
    """The first CPU's "vendor_id", "model name", "cpu family" and "model" from /proc/cpuinfo (those it has).

    A VM's model name can be as vague as "AMD EPYC"; the family and model tell its generation (AMD
    family 25 is Zen 3 and Zen 4, 26 is Zen 5), which decides how wide its vectors are and how its
    prefetchers behave."""
    wanted = {"vendor_id": "vendor", "model name": "cpu", "cpu family": "cpu_family", "model": "cpu_model"}
    found: dict[str, str] = {}
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        if not line.strip():
            break  # the end of the first CPU's block
        key, _, value = line.partition(":")
        if key.strip() in wanted:
            found[wanted[key.strip()]] = value.strip()
    return found


def available_memory_bytes(meminfo: Path = MEMINFO) -> int | None:
    """The memory the OS could give this process without swapping ("MemAvailable" in /proc/meminfo, else
    the free pages), or None where it says neither."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 2**10  # (in kB)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def usable_cpus() -> int:
    """How many CPUs this process may run on (its affinity mask where the OS has one, else every CPU)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
