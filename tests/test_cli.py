"""The command line: main(argv) and the installed entry points."""

import subprocess
import sys

from mlaxgraph.cli.main import main


def test_help_and_bad_arguments(capsys):
    assert main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out
    assert main(["no-such-command"]) == 2
    assert main([]) == 2


def test_python_dash_m_runs_the_command_line():
    result = subprocess.run([sys.executable, "-m", "mlaxgraph", "demo", "--help"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "--policy {float32,bfloat16,float16}" in result.stdout
