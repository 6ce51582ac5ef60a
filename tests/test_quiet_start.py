"""The jobs' quiet start (jobs/_spark.py): what the JVM's stderr filter drops and keeps, and what a
failed fetch of Delta's jars says. The demo's whole output is checked in tests/test_jobs.py."""

from __future__ import annotations

import io
import subprocess
import sys

from processes import ROOT

sys.path.insert(0, str(ROOT / "jobs"))
import _spark  # noqa: E402

JVM_STDERR = b"""\
WARNING: Using incubator modules: jdk.incubator.vector
19:31:13 ERROR WriteToDataSourceV2Exec: Data source write support MicroBatchWrite[epoch: 0] is aborting.
Exception in thread "main" java.lang.RuntimeException: boom
\tat org.apache.spark.deploy.SparkSubmit.main(SparkSubmit.scala)
WARNING: something else Java has to say
no newline at the end"""


def test_the_filter_drops_the_incubator_line_and_keeps_the_rest() -> None:
    out = io.BytesIO()
    _spark.filter_stderr(io.BytesIO(JVM_STDERR), out)
    assert out.getvalue() == JVM_STDERR.split(b"\n", 1)[1]


def test_the_filter_process_passes_lines_as_they_come() -> None:
    """The process `quiet_jvm_start` puts between the JVM and our stderr: a line is through before
    the next is written, and the filter ends when its input does."""
    filt = subprocess.Popen([sys.executable, str(ROOT / "jobs" / "_spark.py"), "filter-stderr"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert filt.stdin is not None and filt.stdout is not None
    filt.stdin.write(b"WARNING: Using incubator modules: jdk.incubator.vector\nfirst\n")
    filt.stdin.flush()
    assert filt.stdout.readline() == b"first\n"
    filt.stdin.write(b"second\n")
    filt.stdin.close()
    assert filt.stdout.read() == b"second\n"
    assert filt.wait(10) == 0


FAILED_FETCH = """\
:: loading settings :: file = /src/conf/ivysettings.xml
Ivy Default Cache set to: /tmp/ivy/cache
:: resolving dependencies :: org.apache.spark#spark-submit-parent-0378;1.0
\tconfs: [default]
:: resolution report :: resolve 1071ms :: artifacts dl 0ms

:: problems summary ::
:::: WARNINGS
\t\tmodule not found: io.delta#delta-spark_4.2_2.13;0.0.404

\t==== central: tried

\t  https://repo1.maven.org/maven2/io/delta/delta-spark_4.2_2.13/0.0.404/delta-spark_4.2_2.13-0.0.404.pom
\t\t::          UNRESOLVED DEPENDENCIES         ::
\t\t:: io.delta#delta-spark_4.2_2.13;0.0.404: not found
Exception in thread "main" java.lang.RuntimeException: [unresolved dependency: io.delta#delta-spark_4.2_2.13;0.0.404: not found]
\tat org.apache.spark.util.MavenUtils$.resolveMavenCoordinates(MavenUtils.scala:539)
Traceback (most recent call last):
  File "jobs/_spark.py", line 230, in <module>
pyspark.errors.exceptions.base.PySparkRuntimeError: [JAVA_GATEWAY_EXITED] Java gateway process exited
"""


def test_a_failed_fetch_shows_ivys_problems_and_sparks_exception() -> None:
    said = _spark.resolver_problems(FAILED_FETCH).splitlines()
    assert said[0] == ":: problems summary ::"
    assert "\t\tmodule not found: io.delta#delta-spark_4.2_2.13;0.0.404" in said
    assert said[-1].startswith('Exception in thread "main" java.lang.RuntimeException: [unresolved dependency')
    assert not any(line.startswith(("\tat ", "Traceback", ":: resolving")) or not line.strip() for line in said)


def test_without_a_problems_summary_the_whole_output_says_why() -> None:
    assert _spark.resolver_problems("Error: Java gateway failed\n\n\tat x.y(Z.java)\n") == "Error: Java gateway failed"


def test_another_line_s_fetch_leaves_the_checkout_s_local_conf_alone() -> None:
    """make compat fetches each other Spark line's Delta jars from that line's virtualenv: that
    fetch wrote conf/local/spark-defaults.conf with its line's jars, and the documentation's Delta
    scripts then started the checkout's Spark 4.2 with Delta for 4.0 (every run of the Sending
    page failed). `fetch-jars --jars-only`, as tests/compat runs it, does not write the file
    (plain `fetch-jars`, as make setup runs it, writes it every time)."""
    local = _spark.LOCAL_CONF
    assert local.exists(), "make setup writes it"
    before = local.stat().st_mtime_ns
    done = subprocess.run([sys.executable, str(ROOT / "jobs" / "_spark.py"), "fetch-jars", "--jars-only"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done
    assert local.stat().st_mtime_ns == before
    compat = (ROOT / "tests" / "compat" / "run.py").read_text()
    assert '"fetch-jars", "--jars-only"' in compat


def test_the_jobs_keep_sparks_tcp_sockets_to_python() -> None:
    """The jobs and the demo leave `spark.python.unix.domain.socket.enabled` at Spark's default. Over
    Unix sockets, an idle Python worker whose socket the JVM closes at `spark.stop()` fails its last
    flush with EPIPE, and pyspark's daemon prints that `BrokenPipeError` stack to the user in some
    runs (over TCP such a write lands in the socket's buffer unnoticed). docs/reading.md offers the
    setting with that caveat."""
    conf = _spark.read_conf()
    assert conf.get("spark.python.unix.domain.socket.enabled", "false").lower() != "true"
