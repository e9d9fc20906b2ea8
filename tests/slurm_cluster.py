"""A real SLURM cluster for the tests: munge, MariaDB + slurmdbd (so sacct works), slurmctld, and two slurmd, each
with eight fake GPUs (gres backed by character devices) so GPU requests are exercised.

Its default partition has one node, this machine under its own name; partition `two` adds a second node on this
machine too, named `localhost` (a name every machine resolves, as a job's rendezvous needs), served by a slurmd of its
own on a port of its own (`slurmd -N`, per-node `Port`): jobs of two nodes run as on a real cluster, one task a node,
with the second node's processes on the same machine.

Needs root and Debian's packages slurmctld slurmd slurmdbd slurm-client munge mariadb-server (`.ci/run` installs
them). Every file goes in one folder; clients find the cluster through $SLURM_CONF. `start()` returns a Cluster whose
`stop()` ends every daemon it started. `python tests/slurm_cluster.py` starts one and waits (Ctrl-C stops it).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurmdbd", "sbatch", "munged", "mariadbd", "mariadb")
PARTITION = "debug"
TWO_NODES = "two"  # the partition of both nodes
SECOND = "localhost"
SLURMD_PORTS = (6918, 6921)
FAKE_GPUS = tuple(f"/dev/fakegpu{i}" for i in range(8))


class ClusterUnavailable(RuntimeError):
    """Why a cluster cannot be started here (tests skip with this reason)."""


@dataclass
class Cluster:
    folder: Path
    env: dict
    node: str  # the default partition's one node
    nodes: tuple[str, ...] = ()  # every node (partition `two`); just `node` where the second cannot be named
    processes: list = field(default_factory=list)

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env={**os.environ, **self.env}, capture_output=True, text=True,
                              check=check, timeout=60)

    def stop(self) -> None:
        """Cancel every job still running (their processes would outlive the daemons and hold their ports), then end
        every daemon."""
        try:
            if self.run("scancel", "--user=root", check=False).returncode == 0:
                deadline = time.monotonic() + 30
                while self.run("squeue", "-h", check=False).stdout.strip() and time.monotonic() < deadline:
                    time.sleep(0.5)
        except subprocess.TimeoutExpired:  # a controller that no longer answers: end the daemons all the same
            pass
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "a SLURM test cluster needs root (daemons, munge key, fake GPU device nodes)"
    missing = [p for p in PACKAGES if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if missing:
        return (f"SLURM/munge/MariaDB not installed ({', '.join(missing)} missing): apt-get install slurmctld slurmd "
                "slurmdbd slurm-client munge mariadb-server")
    return None


def _wait(what: str, check, timeout: float = 30.0, logs: tuple[Path, ...] = ()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    tails = "\n".join(f"--- {p}:\n{p.read_text()[-2000:]}" for p in logs if p.exists())
    raise ClusterUnavailable(f"{what} did not come up in {timeout:.0f} s\n{tails}")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _configs(folder: Path, nodes: tuple[str, ...], cpus: int, memory_mb: int) -> dict[str, str]:
    node = nodes[0]
    common = f"""ClusterName=ablate{os.getpid()}
SlurmctldHost={node}
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
SlurmctldPort=6917
SlurmdPort={SLURMD_PORTS[0]}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6919
JobAcctGatherType=jobacct_gather/linux
SchedulerParameters=bf_interval=1,sched_interval=2
MinJobAge=300
KillWait=5
ReturnToService=2
MpiDefault=none
GresTypes=gpu
"""
    for name, port in zip(nodes, SLURMD_PORTS):  # each node's slurmd listens on a port of its own
        common += (f"NodeName={name} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} RealMemory={memory_mb} "
                   f"Gres=gpu:{len(FAKE_GPUS)} State=UNKNOWN\n")
    common += (f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8\n"
               f"PartitionName={TWO_NODES} Nodes={','.join(nodes)} MaxTime=INFINITE State=UP OverSubscribe=FORCE:8\n")
    gres = "AutoDetect=off\n" + "".join(f"Name=gpu File={dev}\n" for dev in FAKE_GPUS)
    dbd = f"""AuthType=auth/munge
DbdHost=localhost
DbdPort=6919
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
LogFile={folder}/slurmdbd.log
PidFile={folder}/slurmdbd.pid
"""
    return {"slurm.conf": common, "gres.conf": gres, "slurmdbd.conf": dbd}


def start(folder: Path) -> Cluster:
    """Start every daemon with its files in `folder`; raise ClusterUnavailable with the reason when it cannot."""
    reason = why_not()
    if reason:
        raise ClusterUnavailable(reason)
    folder.mkdir(parents=True, exist_ok=True)
    node = socket.gethostname().split(".")[0]
    nodes = (node,) if node == SECOND else (node, SECOND)
    cpus = os.cpu_count() or 1
    memory_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
    for name, text in _configs(folder, nodes, cpus, memory_mb).items():
        (folder / name).write_text(text)
    (folder / "slurmdbd.conf").chmod(0o600)
    for sub in ("state", *(f"spool-{name}" for name in nodes)):
        (folder / sub).mkdir(exist_ok=True)
    for dev in FAKE_GPUS:
        if not Path(dev).exists():
            subprocess.run(["mknod", dev, "c", "1", "3"], check=True)
    cluster = Cluster(folder, {"SLURM_CONF": str(folder / "slurm.conf")}, node, nodes)
    env = {**os.environ, **cluster.env}

    def daemon(*cmd: str, log: str) -> None:
        out = open(folder / log, "ab")
        cluster.processes.append(subprocess.Popen(list(cmd), env=env, stdout=out, stderr=subprocess.STDOUT))

    try:
        Path("/run/munge").mkdir(exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
            daemon("runuser", "-u", "munge", "--", "munged", "--foreground", log="munged.out")
        _wait("munged", lambda: Path("/run/munge/munge.socket.2").exists())

        if not _port_open(3306):
            Path("/run/mysqld").mkdir(exist_ok=True)
            shutil.chown("/run/mysqld", "mysql", "mysql")
            daemon("mariadbd", "--user=mysql", "--bind-address=127.0.0.1", "--port=3306", log="mariadb.out")
        _wait("MariaDB", lambda: _port_open(3306), logs=(folder / "mariadb.out",))
        subprocess.run(["mariadb", "-e", "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm'; "
                        "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm'; "
                        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; "
                        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"], check=True, capture_output=True)

        daemon("slurmdbd", "-D", log="slurmdbd.out")
        _wait("slurmdbd", lambda: _port_open(6919), logs=(folder / "slurmdbd.log", folder / "slurmdbd.out"))
        daemon("slurmctld", "-D", "-i", "-f", str(folder / "slurm.conf"), log="slurmctld.out")
        _wait("slurmctld", lambda: cluster.run("scontrol", "ping", check=False).stdout.count("UP") > 0,
              logs=(folder / "slurmctld.log",))
        for name in nodes:
            daemon("slurmd", "-D", "-N", name, "-f", str(folder / "slurm.conf"), log=f"slurmd-{name}.out")

        def nodes_idle() -> bool:
            states = dict(line.split() for line in cluster.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
                          .stdout.splitlines() if len(line.split()) == 2)
            for name, state in states.items():
                if state.startswith(("drain", "down")):
                    cluster.run("scontrol", "update", f"nodename={name}", "state=resume", check=False)
            return set(states) == set(nodes) and all(s.startswith(("idle", "mix", "alloc")) for s in states.values())

        _wait("the nodes", nodes_idle, timeout=40,
              logs=(*(folder / f"slurmd-{name}.log" for name in nodes), folder / "slurmctld.log"))
        _wait("accounting", lambda: cluster.run("sacct", "-n", "-X", check=False).returncode == 0,
              logs=(folder / "slurmdbd.log",))
    except BaseException:
        cluster.stop()
        raise
    return cluster


if __name__ == "__main__":
    import tempfile

    started = time.monotonic()
    c = start(Path(tempfile.mkdtemp(prefix="slurm-")))
    print(f"cluster up in {time.monotonic() - started:.1f} s; export SLURM_CONF={c.env['SLURM_CONF']}")
    try:
        signal.pause()
    finally:
        c.stop()
