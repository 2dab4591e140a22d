"""`gpusched submit train.sh`: the script's #SBATCH/#GPUSCHED lines, and a script named
without a path, as sbatch treats them; against the real API served by uvicorn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.cli import app as cli_app
from app.cli.client import CliError
from app.cli.sbatch import exported_env
from tests.cli.harness import Cli, Result


def _script(tmp_path: Path, name: str, text: str, *, executable: bool = True) -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o755 if executable else 0o644)
    return path


def _submit(cli: Cli, tmp_path: Path, *args: str) -> Result:
    return cli("submit", "--json", "--workdir", str(tmp_path), *args)


def _job(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, result.stderr
    body: dict[str, Any] = json.loads(result.stdout)
    return body


TRAIN = """#!/bin/bash
# a comment, and a blank line, do not end the header

#SBATCH --job-name=resnet
#SBATCH -N 2 --gres=gpu:2   # two nodes of two GPUs
#SBATCH -t 1-00:00:00
#SBATCH --begin 2030-01-02T03:04:05Z
#SBATCH --mem=64G
#SBATCH --output=logs/%j.out
#GPUSCHED --preemptible --label team=vision
#SBATCH --ntasks-per-node=2 --qos=high
set -e
#SBATCH --gres=gpu:8
srun python train.py --seed "$SLURM_ARRAY_TASK_ID" --out "$SLURM_SUBMIT_DIR/${SLURM_JOB_ID}" "$@"
echo $SLURM_CPUS_PER_TASK; MASTER=$(scontrol show hostnames | head -n 1)
echo "a word like srun in a sentence is not a command" # nor sbatch here
"""


def test_a_scripts_sbatch_and_gpusched_lines_are_its_options(cli: Cli, tmp_path: Path) -> None:
    _script(tmp_path, "train.sh", TRAIN)
    result = _submit(cli, tmp_path, "train.sh", "--epochs", "3")
    job = _job(result)
    assert job["name"] == "resnet"
    assert (job["nodes"], job["gpus"]) == (2, 2)  # not 8: that line comes after `set -e`
    assert job["max_runtime_s"] == 86400
    assert job["schedule"]["at"].startswith("2030-01-02T03:04:05")
    assert job["preemptible"] is True and job["labels"] == {"team": "vision"}
    # Named without a path, the script is the one in the job's directory, as for sbatch;
    # words after it are its arguments.
    assert job["command"] == ["./train.sh", "--epochs", "3"]
    # What has no counterpart here is named, with what to do instead.
    assert "train.sh:8: #SBATCH --mem=64G: ignored: gpusched places GPUs" in result.stderr
    assert "train.sh:9: #SBATCH --output=logs/%j.out: ignored" in result.stderr
    assert "gpusched logs ID" in result.stderr
    notes = " ".join(result.stderr.split())
    assert "train.sh:11: #SBATCH --ntasks-per-node=2: ignored: one process starts per node" in notes
    assert "train.sh:11: #SBATCH --qos=high: ignored: a job's standing is its --priority" in notes
    # Slurm's variables are not set here (libraries would take the job for srun's): where
    # the same is found.
    note = " ".join(result.stderr.split())
    assert (
        "note: train.sh reads Slurm's variables, unset here: $SLURM_ARRAY_TASK_ID "
        "($GPUSCHED_ARRAY_TASK_ID), $SLURM_CPUS_PER_TASK (no counterpart), $SLURM_JOB_ID "
        "($GPUSCHED_JOB_ID), $SLURM_SUBMIT_DIR (the job's working directory, where it starts)"
    ) in note
    assert "note: train.sh runs srun, which gpusched's nodes do not have: run the program" in note
    assert "note: train.sh runs scontrol" in note and "runs sbatch" not in note


def test_the_command_line_wins_over_the_script(cli: Cli, tmp_path: Path) -> None:
    _script(tmp_path, "train.sh", TRAIN)
    job = _job(_submit(cli, tmp_path, "-J", "mine", "--gpus", "1", "-N", "1", "--", "train.sh"))
    assert (job["name"], job["gpus"], job["nodes"]) == ("mine", 1, 1)
    assert job["preemptible"] is True  # what the command line leaves alone still counts


def test_slurm_gpus_count_for_the_whole_job(cli: Cli, tmp_path: Path) -> None:
    _script(tmp_path, "a.sh", "#!/bin/sh\n#SBATCH --gpus=4\n#SBATCH --nodes=2\ntrue\n")
    assert _job(_submit(cli, tmp_path, "a.sh"))["gpus"] == 2  # per node
    assert _job(_submit(cli, tmp_path, "-N", "4", "--", "a.sh"))["gpus"] == 1
    uneven = _submit(cli, tmp_path, "-N", "3", "--", "a.sh")
    assert uneven.exit_code == 2
    assert "a.sh:2: #SBATCH --gpus=4: Slurm counts --gpus for the whole job" in uneven.stderr
    assert "write --gpus-per-node" in uneven.stderr
    _script(tmp_path, "b.sh", "#!/bin/sh\n#SBATCH --gpus-per-node 3 --gres=gpu:h100:2\n")
    job = _job(_submit(cli, tmp_path, "b.sh"))
    assert (job["gpus"], job["gpu_model"]) == (2, "h100")  # the later one, as sbatch


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("#SBATCH -N two", "x.sh:2: Invalid value for '--nodes' / '-N': Input should be a valid"),
        ("#SBATCH train.py", "x.sh:2: #SBATCH train.py: 'train.py' is not an option"),
        ("#GPUSCHED --gpus 2 train.py", "x.sh:2: 'train.py' is not an option"),
        ("#GPUSCHED --no-such", "x.sh:2: No such option: --no-such"),
        ("#SBATCH -w node-3", "x.sh:2: #SBATCH -w=node-3: it asks for all of these nodes"),
        ("#SBATCH --gres=nvme:1", "x.sh:2: #SBATCH --gres=nvme:1: no gpu in it"),
        ("#SBATCH --gpus=all", "x.sh:2: #SBATCH --gpus=all: expected a number of GPUs"),
        ('#SBATCH -J "open', 'x.sh:2: #SBATCH -J "open: No closing quotation'),
    ],
)
def test_a_wrong_script_line_is_named(cli: Cli, tmp_path: Path, line: str, message: str) -> None:
    _script(tmp_path, "x.sh", f"#!/bin/sh\n{line}\ntrue\n")
    result = _submit(cli, tmp_path, "x.sh")
    assert result.exit_code == 2, result.stdout
    assert message in " ".join(result.stderr.split()), result.stderr


def test_a_script_is_sent_as_it_is_now(cli: Cli, tmp_path: Path) -> None:
    script = _script(tmp_path, "run.sh", "#!/bin/sh\necho one\n", executable=False)
    result = _submit(cli, tmp_path, "run.sh")
    job = _job(result)
    # Its copy is what runs (so it need not be executable, as for sbatch), whatever
    # happens to the file meanwhile.
    assert job["command"] == ["./run.sh"] and job["script_bytes"] == len("#!/bin/sh\necho one\n")
    script.write_text("#!/bin/sh\necho two\n")
    assert _stored_script(cli, job["id"]) == "#!/bin/sh\necho one\n"
    shown = " ".join(cli("show", str(job["id"])).stdout.split())
    assert "script the copy taken at submission (19 bytes; --script)" in shown
    # What it runs, as scontrol write batch_script prints it.
    assert cli("show", str(job["id"]), "--script").stdout == "#!/bin/sh\necho one\n"
    none = cli("show", "--script", str(_job(_submit(cli, tmp_path, "true"))["id"]))
    assert none.exit_code == 1 and "has no script copy: it runs its command" in none.stderr
    plain = cli("submit", "--workdir", str(tmp_path), "run.sh")
    assert "it runs ./run.sh as it is now: editing the file changes no job" in plain.stdout


def _stored_script(cli: Cli, job_id: int) -> str | None:
    from app.jobs.models import Job

    with cli.factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.script


def test_what_cannot_run_is_refused_at_submission(cli: Cli, tmp_path: Path) -> None:
    _script(tmp_path, "prog", "not a script\n", executable=False)
    result = _submit(cli, tmp_path, "prog")
    assert result.exit_code == 2
    assert "prog is not executable: chmod +x prog, or submit -- sh prog" in result.stderr
    # A cron batch runs the file as it is at each firing: no copy, so it must be executable.
    _script(tmp_path, "nightly.sh", "#!/bin/sh\ntrue\n", executable=False)
    batch = cli.raw([
        "batch", "create", "nightly", "--url", cli.url, "--token", cli.tokens["alice"],
        "--cron", "0 2 * * *", "--workdir", str(tmp_path), "--", "nightly.sh",
    ])  # fmt: skip
    assert batch.exit_code == 2 and "nightly.sh is not executable" in batch.stderr
    # Nor are its #SBATCH lines read: the batch's options are fixed when it is created.
    _script(tmp_path, "nightly.sh", "#!/bin/sh\n#SBATCH --gpus=4\ntrue\n")
    batch = cli.raw([
        "batch", "create", "nightly", "--url", cli.url, "--token", cli.tokens["admin"],
        "--cron", "0 2 * * *", "--workdir", str(tmp_path), "--", "nightly.sh",
    ])  # fmt: skip
    assert batch.exit_code == 0, batch.stderr
    assert "nightly.sh: #SBATCH and #GPUSCHED lines are not read for a cron batch" in (batch.stderr)
    # Programs on PATH are left as they are, even beside a file of the same name.
    assert _job(_submit(cli, tmp_path, "sh", "prog"))["command"] == ["sh", "prog"]
    (tmp_path / "sh").write_text("not the shell")
    job = _job(_submit(cli, tmp_path, "sh", "prog"))
    assert job["command"] == ["sh", "prog"] and job["script_bytes"] is None
    # A program (no #!) is neither read for options nor copied.
    _script(tmp_path, "prog2", "#SBATCH --gpus=4\n")
    job = _job(_submit(cli, tmp_path, "./prog2"))
    assert job["gpus"] == 1 and job["script_bytes"] is None


def test_a_script_too_big_to_send_runs_from_its_file(cli: Cli, tmp_path: Path) -> None:
    _script(tmp_path, "big.sh", "#!/bin/sh\n" + "#" * 600_000 + "\ntrue\n")
    result = _submit(cli, tmp_path, "big.sh")
    job = _job(result)
    assert job["script_bytes"] is None and job["command"] == ["./big.sh"]
    assert "big.sh is over 524288 bytes: the job runs the file as it is when it starts" in (
        result.stderr
    )


ENVIRON = {
    "PATH": "/opt/conda/envs/nlp/bin:/usr/bin",
    "CONDA_PREFIX": "/opt/conda/envs/nlp",
    "GPUSCHED_TOKEN": "gps_secret",  # gpusched's own settings never travel
    "CUDA_VISIBLE_DEVICES": "3",  # the agent sets it
    "PWD": "/home/alice",  # shell bookkeeping
    "SHLVL": "2",
    "BASH_FUNC_module%%": "() { :; }",  # not a variable name a job can carry
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NONE", {}),
        ("ALL", {"PATH": ENVIRON["PATH"], "CONDA_PREFIX": ENVIRON["CONDA_PREFIX"]}),
        ("PATH", {"PATH": ENVIRON["PATH"]}),
        ("PATH,LR=0.1", {"PATH": ENVIRON["PATH"], "LR": "0.1"}),
        ("ALL,PATH=/usr/bin", {"PATH": "/usr/bin", "CONDA_PREFIX": ENVIRON["CONDA_PREFIX"]}),
    ],
)
def test_export_as_sbatch_reads_it(text: str, expected: dict[str, str]) -> None:
    assert exported_env(text, ENVIRON) == expected


def test_export_of_what_is_not_there_is_refused() -> None:
    with pytest.raises(CliError, match="--export: WANDB_API_KEY is not set in your environment"):
        exported_env("PATH,WANDB_API_KEY", ENVIRON)
    crowded = {f"V{i}": "x" for i in range(300)}
    with pytest.raises(CliError, match="300 variables, more than the 256 a job may carry"):
        exported_env("ALL", crowded)


def test_a_slurm_script_is_told_its_environment_is_not_exported(cli: Cli, tmp_path: Path) -> None:
    _script(tmp_path, "a.sh", "#!/bin/sh\n#SBATCH -J a\npython train.py\n")
    result = _submit(cli, tmp_path, "a.sh")
    assert _job(result)["env"] == {}
    assert "sbatch would start it with your environment (--export=ALL)" in " ".join(
        result.stderr.split()
    )
    _script(tmp_path, "b.sh", "#!/bin/sh\n#SBATCH -J b --export=PATH,CONDA_PREFIX\n")
    result = cli(
        "submit", "--json", "--workdir", str(tmp_path), "--env", "LR=1", "b.sh",
        PATH=ENVIRON["PATH"], CONDA_PREFIX=ENVIRON["CONDA_PREFIX"],
    )  # fmt: skip
    job = _job(result)
    assert job["env"] == {
        "PATH": ENVIRON["PATH"],
        "CONDA_PREFIX": ENVIRON["CONDA_PREFIX"],
        "LR": "1",
    }
    assert "sbatch would start it" not in result.stderr


def test_parsable_prints_only_the_id_for_a_pipeline(cli: Cli, tmp_path: Path) -> None:
    # jid=$(gpusched submit --parsable train.sh); gpusched submit --dependency afterok:$jid ...
    first = cli("submit", "--parsable", "--", "true")
    assert first.exit_code == 0 and first.stdout.strip().isdigit()
    after = cli("submit", "--parsable", "--dependency", f"afterok:{first.stdout.strip()}", "true")
    assert int(after.stdout) == int(first.stdout) + 1
    _script(tmp_path, "s.sh", "#!/bin/sh\n#SBATCH --parsable --array=0-2\ntrue\n")
    array = cli("submit", "--workdir", str(tmp_path), "s.sh")
    assert array.exit_code == 0 and array.stdout == f"{int(after.stdout) + 1}\n"  # its id
    both = cli("submit", "--parsable", "--json", "--", "true")
    assert both.exit_code == 2 and "give --parsable or --json, not both" in both.stderr


def test_a_program_on_path_is_not_read_for_options(cli: Cli, tmp_path: Path) -> None:
    # `submit sh x` runs /bin/sh, whatever a local file named sh says.
    _script(tmp_path, "sh", "#!/bin/sh\n#SBATCH --gpus=4\n")
    job = _job(_submit(cli, tmp_path, "sh", "-c", "true"))
    assert (job["gpus"], job["command"], job["script_bytes"]) == (1, ["sh", "-c", "true"], None)


def test_a_script_on_standard_input(cli: Cli, tmp_path: Path) -> None:
    # sbatch < train.sh: no program, the script is the job.
    def submit(text: str, *args: str) -> Result:
        connection = ["--url", cli.url, "--token", cli.tokens["alice"]]
        argv = ["submit", *connection, "--json", "--workdir", str(tmp_path), *args]
        return cli.runner.invoke(cli_app, argv, input=text, env=cli.env())

    text = '#!/bin/bash\n#SBATCH -J piped --gres=gpu:2\necho "$SLURM_JOB_ID"\n'
    result = submit(text)
    job = _job(result)
    assert (job["name"], job["gpus"], job["command"]) == ("piped", 2, ["script"])
    assert job["script_bytes"] == len(text)
    assert _stored_script(cli, job["id"]) == text
    assert "note: script reads Slurm's variables" in result.stderr
    assert _job(submit(text, "--gpus", "1"))["gpus"] == 1  # the command line still wins
    not_a_script = submit("python train.py\n")
    assert not_a_script.exit_code == 2
    assert "standard input is not a script: its first line must start with #!" in (
        not_a_script.stderr
    )
    nothing = submit("")
    assert nothing.exit_code == 2 and "no command" in nothing.stderr
