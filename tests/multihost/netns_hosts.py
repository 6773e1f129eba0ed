"""Two "hosts" on this machine, each its own network namespace and its own mounts, for running
pivotflow on a Ray cluster that really spans two IP addresses.

Host A (10.77.0.1) and host B (10.77.0.2) are network namespaces joined by a veth pair, each
with ``lo`` up and nothing else: their traffic never leaves this machine (no route to the
host's interfaces, nothing bridged). Each host has one long-lived "anchor" process in a private
mount namespace with its own tmpfs on ``/dev/shm`` (so the parameter store and Ray's object
store really are two); host B gets its own ``/tmp`` as well, so nothing a process on A leaves
in /tmp (Ray's session folder, worker logs, key files) is visible on B unless it was copied
there, as on two machines. Every command for a host runs inside its anchor's namespaces
(``nsenter -t ANCHOR -n -m``). The pid namespace is shared: the test can see and kill any
host's processes, which it finds by their network namespace.

    python tests/multihost/netns_hosts.py up|down     (by hand: make or remove the two hosts)

Needs root (``ip netns``, ``unshare``, ``nsenter``); ``can_make_hosts`` says why not when not.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout the hosts run
PREFIX = "pfmh"  # every namespace and link this module makes starts so (teardown finds them)
SUBNET = "10.77.0"


@dataclass
class Host:
    """One namespace host: its name, address, and the anchor process that holds its mounts."""

    name: str
    ip: str
    netns: str
    link: str
    private_tmp: bool
    anchor: subprocess.Popen[bytes] | None = None
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def argv(self, cmd: list[str]) -> list[str]:
        """``cmd`` run on this host (its network and mount namespaces)."""
        assert self.anchor is not None, f"host {self.name} is not up"
        return ["nsenter", "-t", str(self.anchor.pid), "-n", "-m", f"--wd={os.getcwd()}", "--",
                *cmd]

    def run(self, cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(cmd), env=env, timeout=timeout, check=check,
                              capture_output=True, text=True)

    def popen(self, cmd: list[str], *, env: dict[str, str] | None = None,
              **kw: object) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(self.argv(cmd), env=env, **kw)  # type: ignore[call-overload]
        self.started.append(proc)
        return proc

    def pids(self) -> list[int]:
        """Every process in this host's network namespace (its anchor included)."""
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True,
                             text=True, check=False).stdout
        return [int(p) for p in out.split()]

    def copy_in(self, path: Path) -> None:
        """Make the folder ``path`` (on this machine's filesystem) exist at the same path on
        this host, file by file (a host with its own /tmp does not see the machine's)."""
        if not self.private_tmp:
            return
        self.run(["mkdir", "-p", str(path)])
        for f in sorted(path.iterdir()):
            if f.is_file():
                subprocess.run(self.argv(["sh", "-c", 'cat > "$1" && chmod "$2" "$1"', "sh",
                                          str(f), oct(f.stat().st_mode & 0o777)[2:]]),
                               input=f.read_bytes(), check=True, timeout=30)

    def shm_entries(self) -> list[str]:
        return self.run(["ls", "-A", "/dev/shm"], check=False).stdout.split()


def can_make_hosts() -> str:
    """"" when this process can make the hosts, else a one-line reason."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns, unshare, nsenter)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True,
                          check=False)
    if made.returncode != 0:
        return f"ip netns add is not permitted here: {made.stderr.strip()[:200]}"
    try:
        unshared = subprocess.run(
            ["ip", "netns", "exec", probe, "unshare", "-m", "--propagation", "private", "sh",
             "-c", "mount -t tmpfs tmpfs /dev/shm"], capture_output=True, text=True,
            check=False, timeout=30)
    finally:
        subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True)
    if unshared.returncode != 0:
        return f"a private /dev/shm is not permitted here: {unshared.stderr.strip()[:200]}"
    return ""


class TwoHosts:
    """Hosts A and B joined by a veth pair; ``close`` kills everything on them and removes
    them (safe to call twice, and after a failed start)."""

    def __init__(self, tag: str | None = None) -> None:
        tag = tag or str(os.getpid())
        self.tag = tag
        self.a = Host("A", f"{SUBNET}.1", f"{PREFIX}-{tag}-a", f"{PREFIX}{tag}a"[:15],
                      private_tmp=False)
        self.b = Host("B", f"{SUBNET}.2", f"{PREFIX}-{tag}-b", f"{PREFIX}{tag}b"[:15],
                      private_tmp=True)
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    @property
    def hosts(self) -> tuple[Host, Host]:
        return self.a, self.b

    def _make(self) -> None:
        ip = ["ip"]
        for h in self.hosts:
            subprocess.run([*ip, "netns", "add", h.netns], check=True, capture_output=True)
        subprocess.run([*ip, "link", "add", self.a.link, "type", "veth", "peer", "name",
                        self.b.link], check=True, capture_output=True)
        for h in self.hosts:
            n = [*ip, "-n", h.netns]
            subprocess.run([*ip, "link", "set", h.link, "netns", h.netns], check=True,
                           capture_output=True)
            subprocess.run([*n, "addr", "add", f"{h.ip}/24", "dev", h.link], check=True,
                           capture_output=True)
            subprocess.run([*n, "link", "set", h.link, "up"], check=True, capture_output=True)
            subprocess.run([*n, "link", "set", "lo", "up"], check=True, capture_output=True)
            mounts = "mount -t tmpfs -o size=4g,mode=1777 tmpfs /dev/shm"
            if h.private_tmp:
                mounts += " && mount -t tmpfs -o mode=1777 tmpfs /tmp"
                if REPO.is_relative_to("/tmp"):  # a checkout under /tmp (CI's clone): B
                    # sees the code at the same path, as a real node has it installed
                    keep = shlex.quote(f"/run/{PREFIX}-repo-{self.tag}")
                    repo = shlex.quote(str(REPO))
                    mounts = (f"mkdir -p {keep} && mount --bind {repo} {keep} && {mounts}"
                              f" && mkdir -p {repo} && mount --bind {keep} {repo}")
            # the anchor: holds the host's mount namespace; every command enters it
            h.anchor = subprocess.Popen(
                ["ip", "netns", "exec", h.netns, "unshare", "-m", "--propagation", "private",
                 "sh", "-c", f"{mounts} && echo up && exec sleep 100000"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert h.anchor.stdout is not None
            if h.anchor.stdout.readline().strip() != b"up":
                err = h.anchor.stderr.read().decode() if h.anchor.stderr else ""
                raise RuntimeError(f"host {h.name}: its mounts failed: {err.strip()[:300]}")
        # the pair is up: wait until A reaches B (a TCP connect to a closed port is refused
        # once the link works; before that it times out)
        deadline = time.monotonic() + 20
        probe = ("import socket,sys\ns=socket.socket();s.settimeout(1)\n"
                 f"try: s.connect(('{self.b.ip}', 9))\n"
                 "except ConnectionRefusedError: sys.exit(0)\n"
                 "except OSError: sys.exit(1)\n")
        while self.a.run([sys.executable, "-c", probe], check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"host A does not reach {self.b.ip} over the veth pair")
            time.sleep(0.2)

    def kill_host(self, host: Host) -> list[int]:
        """SIGKILL every process on ``host`` but its anchor (the machine "loses power"; its
        mounts stay until ``close``); the pids killed."""
        keep = {host.anchor.pid} if host.anchor else set()
        killed = []
        for pid in host.pids():
            if pid not in keep:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        return killed

    def close(self) -> None:
        for h in self.hosts:
            for _ in range(3):  # processes forked while we kill: go round again
                if not [p for p in h.pids() if not h.anchor or p != h.anchor.pid]:
                    break
                self.kill_host(h)
                time.sleep(0.2)
            for proc in [*h.started, *([h.anchor] if h.anchor else [])]:
                if proc.poll() is None:
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
            h.anchor = None  # its tmpfs mounts went with its mount namespace
            subprocess.run(["ip", "netns", "del", h.netns], check=False, capture_output=True)
        # a veth goes with its namespace; the host side only if making it failed half way
        subprocess.run(["ip", "link", "del", self.a.link], check=False, capture_output=True)
        # A shares this machine's /tmp: Ray's session folder there (B's went with its tmpfs)
        shutil.rmtree(f"/tmp/{PREFIX}-ray-{self.tag}", ignore_errors=True)
        with contextlib.suppress(OSError):  # B's mount point for a checkout under /tmp
            os.rmdir(f"/run/{PREFIX}-repo-{self.tag}")


@dataclass
class Cluster:
    """The two hosts with Ray started across them (the ``two_hosts`` fixture's value)."""

    hosts: TwoHosts
    address: str
    keys: Path  # CurveZMQ keys, copied to the same path on B (B has its own /tmp)


def ray_env() -> dict[str, str]:
    """The environment for Ray on the two hosts. ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1``: at 0
    (what the fake cluster's tests set, to keep Ray on loopback) ``ray start --address`` refuses
    to start a second node at all ("Multi-node Ray clusters are not supported"), and Ray takes
    127.0.0.1 as every node's address. Here the hosts have no other interface to leak to."""
    return dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1", RAY_USAGE_STATS_ENABLED="0",
                # a killed host is declared dead within seconds, not Ray's default ~30 s
                RAY_health_check_initial_delay_ms="1000", RAY_health_check_period_ms="1000",
                RAY_health_check_timeout_ms="1000", RAY_health_check_failure_threshold="3")


RAY_PORT = 6390
OBJECT_STORE_BYTES = 300_000_000  # each host's /dev/shm is a 4 GB tmpfs; Ray wants it all


def start_ray(hosts: TwoHosts, cpus: int = 2, head_cpus: int | None = None,
              timeout_s: float = 240) -> str:
    """A Ray head on A and a worker node on B, ``cpus`` logical CPUs each; the GCS address.
    Raises RuntimeError with ray's own message when a node does not start."""
    common = [f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats"]
    a, b = hosts.a, hosts.b
    address = f"{a.ip}:{RAY_PORT}"
    for host, args in (
            (a, ["--head", f"--port={RAY_PORT}", "--include-dashboard=false",
                 f"--temp-dir=/tmp/{PREFIX}-ray-{hosts.tag}",
                 f"--num-cpus={cpus if head_cpus is None else head_cpus}"]),
            (b, [f"--address={address}", f"--num-cpus={cpus}"])):
        done = host.run(["ray", "start", f"--node-ip-address={host.ip}", *args, *common],
                        env=ray_env(), timeout=timeout_s, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"ray start on host {host.name} failed: {' | '.join(tail)}")
    return address


def leftovers(tag: str = "") -> list[str]:
    """This module's namespaces and links still on the machine (none after ``close``); with
    ``tag``, only those of the ``TwoHosts(tag)`` (another suite beside this one may have its
    own up meanwhile)."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                        check=False).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True,
                           check=False).stdout
    names = ([line.split()[0] for line in ns.splitlines() if line.startswith(PREFIX)]
             + [w.rstrip(":").split("@")[0] for line in links.splitlines()
                for w in line.split()[1:2] if w.startswith(PREFIX)])
    if not tag:
        return names
    # a host's namespace is PREFIX-TAG-x, its link end PREFIXTAGx cut to 15 characters
    mine = (f"{PREFIX}-{tag}-a", f"{PREFIX}-{tag}-b", f"{PREFIX}{tag}a"[:15], f"{PREFIX}{tag}b"[:15])
    return [n for n in names if n in mine]


if __name__ == "__main__":
    if sys.argv[1:] == ["down"]:
        for name in leftovers():
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
            subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)
        print(leftovers() or "nothing left")
    else:
        sys.exit(f"usage: {sys.argv[0]} down   (up is for the tests: TwoHosts())")
