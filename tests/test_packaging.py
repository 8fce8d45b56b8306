"""The wheel installs and works without the checkout: built as `make dist` builds it, installed with its spark
extra into a fresh virtual environment, and run from an empty directory (the README's hello world, the CLI, a
job through `sparkbus submit`)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JOB = textwrap.dedent('''
    import sparkbus
    from sparkbus.spark import get_spark

    assert "site-packages" in sparkbus.__file__, sparkbus.__file__
    spark = get_spark("job")
    print("rows:", spark.read.format("sparkbus").option("namespace", "hello-ns").option("entity", "orders").load().count())
''')


def test_the_built_wheel_installs_with_its_spark_extra_and_runs_from_an_empty_directory(tmp_path):
    """In an environment where the wheel is installed (its bin/ first on PATH, as when it is activated): the
    README's hello world runs as written, the CLI sends, and `sparkbus submit` runs a job with the packaged
    Spark configuration (no INFO logging) that finds the "sparkbus" data source without registration; with
    the ui extra, the Explorer renders from the templates and stylesheet the wheel carries."""
    from test_docs import README, code_blocks

    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), REPO],
                   check=True, capture_output=True)
    wheels = list(dist.glob("sparkbus-*.whl"))
    assert len(wheels) == 1, wheels
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    python, sparkbus_command = str(venv / "bin" / "python"), str(venv / "bin" / "sparkbus")
    # --no-compile: imports compile what they use (compiling all of pyspark and pandas first took 10 s)
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-compile", f"{wheels[0]}[spark,ui]"], check=True,
                   capture_output=True)
    hello = next(block for block in code_blocks(README) if block.runnable)
    (work / "hello.py").write_text(hello.code)
    (work / "job.py").write_text(JOB)
    unset = ("PYTHONPATH", "SPARK_CONF_DIR", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "VIRTUAL_ENV")
    environment = {k: v for k, v in os.environ.items() if k not in unset}
    environment["PATH"] = f"{venv / 'bin'}:{os.environ['PATH']}"

    def run(*argv: str) -> subprocess.CompletedProcess:
        done = subprocess.run(argv, cwd=work, env=environment, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done
    printed = run(python, "hello.py").stdout.splitlines()
    assert all(line in printed for line in hello.output), printed
    run(sparkbus_command, "send", "--namespace", "hello-ns", "--entity", "orders", "--body", "kept")
    explorer = run(python, "-c", "import importlib.resources as r; from sparkbus.explorer.notebook import "
                   "dashboard_html; print(r.files('sparkbus.explorer.static').joinpath('explorer.css').is_file(), "
                   "'>orders<' in dashboard_html('hello-ns'))")
    assert explorer.stdout.split() == ["True", "True"], explorer.stdout
    job = run(sparkbus_command, "submit", "--master", "local[1]", "--conf", "spark.ui.enabled=false", "job.py")
    assert job.stdout.splitlines()[-1] == "rows: 1"
    assert " INFO " not in job.stderr, job.stderr[-3000:]
