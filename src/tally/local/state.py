"""The local state directory (``.tally`` next to the template, or ``$TALLY_STATE_DIR``): the
name of every file local mode keeps in it, and of the directory itself."""

from __future__ import annotations

STATE_DIR_NAME = ".tally"
# The running stack: its endpoints, resource names and the processes it started.
STATE_FILE = "local.json"
# `tally local env --sam`, written by `up` where samconfig.toml's local_invoke expects it.
SAM_ENV_FILE = "sam-env.json"
DYNAMODB_LOG = "dynamodb-local.log"
MOTO_LOG = "moto.log"
# The functions' JSON logs and EMF metrics, as CloudWatch would hold them; one stack's only.
FUNCTION_LOG = "functions.log"
# Where the local stream pump resumes.
CHECKPOINT_FILE = "stream-checkpoint.json"
# Every alert the local subscriber received, one JSON object a line.
ALERTS_FILE = "alerts.jsonl"
# `tally demo` runs on a stack of its own, recorded in this subdirectory.
DEMO_DIR = "demo"
# A multi-Region stack: each Region after the first keeps its alerts, checkpoint and
# functions' log in a directory of this one named for it.
REGIONS_DIR = "regions"
# Its emulator's settings (what `up --regions` asked for) and log.
REPLICATION_SETTINGS = "replication.json"
REPLICATION_LOG = "replication.log"
