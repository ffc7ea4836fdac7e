#!/bin/bash
# By hand (docs/maxtext.md): the entrypoint (.venv, Python 3.11, as the embedded kubelet runs it) around
# real MaxText (.venv-maxtext, `python3 dev.py maxtext`), 1 process on 4 simulated CPU devices:
#   A  SIGTERM after 30 steps        -> 42, an emergency checkpoint committed
#   B  the same command again        -> resumes, 0 with the final step committed
#   C  again                         -> 0 at once (MaxText alone exits 1 on a finished run)
#   D  an unknown key                -> 2
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
RUN=$(mktemp -d /tmp/maxtext-entry-XXXXXX)
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT RESLICE_MAXTEXT_PYTHON=${MAXTEXT_PYTHON:-$ROOT/.venv-maxtext/bin/python}
export JAX_PLATFORMS=cpu JAX_NUM_CPU_DEVICES=4
export RESLICE_RUN_DIR=$RUN RESLICE_SEGMENT=0 RESLICE_RESTART_ATTEMPT=0 RESLICE_GLOBAL_BATCH=4 RESLICE_NUM_PROCESSES=1
export JAX_COORDINATOR_ADDRESS=localhost JOB_INDEX=0 JOB_COMPLETION_INDEX=0 PROCESSES_IN_JOB=1 JAX_PROCESS_COUNT=1
MODEL="max_target_length=32 base_emb_dim=64 base_num_query_heads=2 base_num_kv_heads=2 base_mlp_dim=128
  base_num_decoder_layers=2 head_dim=32 vocab_size=256 enable_tensorboard=false log_period=1
  attention=dot_product dataset_type=synthetic"
# As launcher/maxtext.py renders them for 1 slice of 4 devices at global batch 4.
KEYS="steps=120 learning_rate_schedule_steps=120 per_device_batch_size=1 gradient_accumulation_steps=1
  dcn_data_parallelism=1 ici_fsdp_parallelism=4 base_output_directory=$RUN run_name=maxtext checkpoint_period=100
  enable_checkpointing=true async_checkpointing=true enable_autocheckpoint=true skip_jax_distributed_system=false"
entry() { nice -n 10 "$PY" -m maxtext_entry -- $MODEL $KEYS "$@"; }
now() { date +%s.%N; }
t0=$(now)
# Not through the function: a backgrounded function is a subshell, and SIGTERM would reach bash.
nice -n 10 "$PY" -m maxtext_entry -- $MODEL $KEYS 2> "$RUN/a.log" &
pid=$!
until [ "$(cat "$RUN"/metrics/*.jsonl 2>/dev/null | wc -l)" -ge 30 ]; do sleep 0.5; kill -0 $pid 2>/dev/null || break; done
echo "A: $(cat "$RUN"/metrics/*.jsonl | wc -l) records after $(echo "$(now) - $t0" | bc) s; SIGTERM"
t=$(now); kill -TERM $pid; wait $pid; echo "A: exit $? $(echo "$(now) - $t" | bc) s after SIGTERM"
echo "   checkpoints: $(ls "$RUN/maxtext/checkpoints" | sort -n | tr '\n' ' ')"; echo "   $(cat "$RUN/status.json")"
t=$(now); entry 2> "$RUN/b.log"; echo "B: exit $? in $(echo "$(now) - $t" | bc) s"
echo "   checkpoints: $(ls "$RUN/maxtext/checkpoints" | sort -n | tr '\n' ' ')"; echo "   $(cat "$RUN/status.json")"
wc -l "$RUN"/metrics/*.jsonl
t=$(now); entry 2> "$RUN/c.log"; echo "C: exit $? in $(echo "$(now) - $t" | bc) s: $(tail -1 "$RUN/c.log")"
export RESLICE_RUN_DIR=$RUN/d
t=$(now); entry no_such_key=1 base_output_directory="$RUN/d" 2> "$RUN/d.log"
echo "D: exit $? in $(echo "$(now) - $t" | bc) s: $(tail -1 "$RUN/d.log")"
echo "logs and files: $RUN"
