"""`sparkbus submit`: run a job script through the spark-submit of the installed pyspark, set up as a job
needs it wherever it is started from.

spark-submit run by hand from a shell whose virtualenv is not activated fails (its launcher looks for
pyspark with the `python3` on PATH, finds none and runs `/bin/spark-class`), starts Python workers with that
other `python3` (which lacks sparkbus), and logs at INFO (about 140 lines per job). Here SPARK_HOME is the
installed pyspark, both Pythons are the running interpreter, and SPARK_CONF_DIR is the packaged
configuration (sparkbus.spark.CONF_DIR: WARN logging, the Spark settings get_spark uses), each unless the
environment already sets it; a local master binds to the loopback address.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

from . import CONF_DIR


@dataclass(frozen=True)
class Submission:
    """The spark-submit command line of a job and the environment it runs in."""

    argv: list[str]
    env: dict[str, str]


def find_job(job: str, jobs_dir: str = "jobs") -> str:
    """The script a job names: a path to a .py file, or the name of one in jobs_dir (e.g. 'demo' for
    jobs/demo.py). FileNotFoundError says what was looked for."""
    candidates = [job] if job.endswith(".py") or os.sep in job else [os.path.join(jobs_dir, f"{job}.py"), job]
    for path in candidates:
        if os.path.isfile(path):
            return path
    known = sorted(name[:-3] for name in os.listdir(jobs_dir) if name.endswith(".py")) if os.path.isdir(jobs_dir) else []
    hint = f"; the jobs in {jobs_dir}/: {', '.join(known)}" if known else ""
    raise FileNotFoundError(f"no job script {' or '.join(repr(c) for c in candidates)}{hint}")


def submission(job: str, job_args: Sequence[str], *, master: str | None = None, conf: Sequence[tuple[str, str]] = (),
               environ: Mapping[str, str] | None = None) -> Submission:
    """How to run job (find_job) with job_args: spark-submit's options (--master, --conf KEY=VALUE) first."""
    import pyspark

    home = os.path.dirname(os.path.abspath(pyspark.__file__))
    env = dict(os.environ if environ is None else environ)
    env.setdefault("SPARK_HOME", home)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    env.setdefault("SPARK_CONF_DIR", CONF_DIR)
    if master is None or master.startswith("local"):  # else Spark warns that the hostname is a loopback address
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    argv = [os.path.join(env["SPARK_HOME"], "bin", "spark-submit")]
    if master:
        argv += ["--master", master]
    for key, value in conf:
        argv += ["--conf", f"{key}={value}"]
    return Submission([*argv, find_job(job), *job_args], env)


def run(plan: Submission) -> int:
    """Run a submission in the foreground and return its exit code (Ctrl-C reaches spark-submit too: it is
    in this process group)."""
    return subprocess.run(plan.argv, env=plan.env).returncode
