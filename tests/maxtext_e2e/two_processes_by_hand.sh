#!/bin/bash
# By hand (docs/maxtext.md): the rendered distributed environment and the CPU fold of slices into ICI
# data parallelism, with real MaxText. Two entrypoints as the two pods of 2 one-host slices (2 CPU
# devices each: dcn_data_parallelism=2, ici_fsdp_parallelism=2), then one process on 4 devices at the
# same global batch (8), and the per-step losses of both side by side.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
RUN=$(mktemp -d /tmp/maxtext-2p-XXXXXX)
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT RESLICE_MAXTEXT_PYTHON=${MAXTEXT_PYTHON:-$ROOT/.venv-maxtext/bin/python} JAX_PLATFORMS=cpu
export RESLICE_SEGMENT=0 RESLICE_RESTART_ATTEMPT=0 RESLICE_GLOBAL_BATCH=8 JAX_COORDINATOR_ADDRESS=localhost
MODEL="max_target_length=32 base_emb_dim=64 base_num_query_heads=2 base_num_kv_heads=2 base_mlp_dim=128
  base_num_decoder_layers=2 head_dim=32 vocab_size=256 enable_tensorboard=false log_period=1
  attention=dot_product dataset_type=synthetic steps=20 learning_rate_schedule_steps=20 checkpoint_period=10
  enable_checkpointing=true async_checkpointing=true enable_autocheckpoint=true skip_jax_distributed_system=false
  per_device_batch_size=2 gradient_accumulation_steps=1 run_name=maxtext ${EXTRA:-}"  # EXTRA: more keys
now() { date +%s.%N; }
t=$(now)
for i in 0 1; do
  RESLICE_RUN_DIR=$RUN/two RESLICE_NUM_PROCESSES=2 RESLICE_SLICE_INDEX=$i RESLICE_HOSTS_PER_SLICE=1 JOB_INDEX=$i \
  JOB_COMPLETION_INDEX=0 PROCESSES_IN_JOB=1 JAX_PROCESS_COUNT=2 JAX_NUM_CPU_DEVICES=2 \
    nice -n 10 "$PY" -m maxtext_entry -- $MODEL base_output_directory=$RUN/two dcn_data_parallelism=2 \
    ici_fsdp_parallelism=2 2> "$RUN/two-$i.log" &
  pids[$i]=$!
done
wait ${pids[0]}; a=$?; wait ${pids[1]}; b=$?
echo "2 processes x 2 devices: exits $a $b in $(echo "$(now) - $t" | bc) s"
t=$(now)
RESLICE_RUN_DIR=$RUN/one RESLICE_NUM_PROCESSES=1 JOB_INDEX=0 JOB_COMPLETION_INDEX=0 PROCESSES_IN_JOB=1 \
JAX_PROCESS_COUNT=1 JAX_NUM_CPU_DEVICES=4 nice -n 10 "$PY" -m maxtext_entry -- $MODEL base_output_directory=$RUN/one \
  dcn_data_parallelism=1 ici_fsdp_parallelism=4 2> "$RUN/one.log"
echo "1 process x 4 devices: exit $? in $(echo "$(now) - $t" | bc) s"
"$PY" - "$RUN" <<'PY'
import glob, json, sys
run = sys.argv[1]
def losses(d):
    files = glob.glob(f"{run}/{d}/metrics/*.jsonl")
    return {r["step"]: r["learning/loss"] for f in files for r in map(json.loads, open(f))}
two, one = losses("two"), losses("one")
print(f"records: two {len(two)} one {len(one)}; metrics files under two/: {len(glob.glob(f'{run}/two/metrics/*'))}")
diff = max(abs(two[s] - one[s]) for s in one if s in two)
print(f"max |loss(2 processes) - loss(1 process)| over {len(set(one) & set(two))} steps: {diff:.3g}")
PY
echo "logs and files: $RUN"
