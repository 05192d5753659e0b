"""The command line: main(argv) and the installed entry points."""

import subprocess
import sys

from mlaxgraph.cli import main


def test_demo_prints_summary_and_policy_casts(capsys):
    assert main(["demo", "--batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "trainable params: 7,434" in out
    assert "[float32] outputs float32[4, 10]" in out
    assert "[bfloat16] outputs float32[4, 10]" in out
    assert "%res1/conv_a_f32 = cast to float32 of %conv_a" in out


def test_help_and_bad_arguments(capsys):
    assert main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out
    assert main(["no-such-command"]) == 2
    assert main([]) == 2


def test_python_dash_m_runs_the_demo():
    result = subprocess.run([sys.executable, "-m", "mlaxgraph", "demo", "--batch", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "casts inserted by the policy: 8" in result.stdout
