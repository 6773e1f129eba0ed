"""A precompiled ``<bits/stdc++.h>`` for the code reward's C++ programs.

Competitive programmers open nearly every C++ program with ``#include <bits/stdc++.h>``, the
whole standard library: g++ spends ~1.1 s of CPU parsing it before the program's own lines
(here; 0.3 s with it precompiled). This builds it once per host, compiler and flags, under
``cache_root()/cxx-pch-<key>/bits/stdc++.h.gch``, from the system's own header (trusted input,
as the run's user, outside any sandbox), and the runner compiles with ``-I`` that folder
(bound read-only into each sandbox): g++ looks for ``NAME.gch`` in each include folder before
``NAME`` itself and takes it when it was built with the same flags; otherwise
(``-Winvalid-pch``) it warns and reads the header as usual, so a stale or damaged file costs
time, never a wrong build.

The first C++ program of a runner on a host without it waits for the build (~4 s of CPU, a
~100 MB file); a build that fails leaves a warning, and programs compile without it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import subprocess
from pathlib import Path

from pivotflow.rl.code_runner import CXX_FLAGS
from pivotflow.tasks.cache import cache_root

log = logging.getLogger("pivotflow.code_reward")

HEADER = "bits/stdc++.h"


def header_folder(compiler: str) -> Path:
    """The folder the runner adds with ``-I``: one per compiler build and flags."""
    version = subprocess.run([compiler, "-dumpfullversion", "-dumpmachine"], check=True,
                             capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join([os.path.realpath(compiler), version, *CXX_FLAGS])
                         .encode()).hexdigest()[:16]
    return cache_root() / f"cxx-pch-{key}"


def built(folder: Path) -> bool:
    return (folder / f"{HEADER}.gch").is_file()


async def build(compiler: str, folder: Path) -> bool:
    """Precompiles the system's ``<bits/stdc++.h>`` into ``folder`` (written aside, then
    renamed: two runs building at once each leave a whole file). False, with a warning, when
    the compiler has no such header or fails: C++ programs then compile without it."""
    source = await _system_header(compiler)
    if source is None:
        log.warning("code_reward: %s has no <%s>; C++ programs compile without it "
                    "precompiled", compiler, HEADER)
        return False
    target = folder / f"{HEADER}.gch"
    target.parent.mkdir(parents=True, exist_ok=True)
    aside = target.with_name(f".{target.name}.{os.getpid()}-{os.urandom(4).hex()}")
    proc = await asyncio.create_subprocess_exec(
        compiler, *CXX_FLAGS, "-x", "c++-header", source, "-o", str(aside),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await proc.communicate()
    except BaseException:  # (a cancelled call, a run's end: no compiler left writing)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        aside.unlink(missing_ok=True)
        raise
    if proc.returncode != 0:
        aside.unlink(missing_ok=True)
        why = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1][:200]
        log.warning("code_reward: precompiling <%s> failed (%s); C++ programs compile "
                    "without it", HEADER, why)
        return False
    os.replace(aside, target)
    return True


async def _system_header(compiler: str) -> str | None:
    """The path of the header ``#include <bits/stdc++.h>`` reads (g++ ``-H`` names it)."""
    proc = await asyncio.create_subprocess_exec(
        compiler, *CXX_FLAGS, "-x", "c++", "-fsyntax-only", "-H", "-",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate(f"#include <{HEADER}>\n".encode())
    for line in err.decode(errors="replace").splitlines():
        path = line.lstrip(". ").strip()
        if line.startswith(". ") and path.endswith(HEADER):
            return path
    return None
