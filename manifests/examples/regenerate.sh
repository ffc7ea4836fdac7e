#!/usr/bin/env bash
# Regenerates the golden JobSets; tests/launcher/test_golden.py renders each line and compares.
set -euo pipefail
cd "$(dirname "$0")"
reslice render --preset tpu7x-4x4x4 --slices 1 --run llm --image us-docker.pkg.dev/proj/repo/reslice-trainer:v1 --run-dir gs://bucket/runs/llm --global-batch 512 --config olmoe-1b --output tpu7x-4x4x4-1slice.yaml
reslice render --preset tpu7x-4x4x4 --slices 4 --run llm --image us-docker.pkg.dev/proj/repo/reslice-trainer:v1 --run-dir gs://bucket/runs/llm --global-batch 512 --config olmoe-1b --queue multislice-queue --tas-topology cloud.google.com/gke-nodepool --output tpu7x-4x4x4-4slices.yaml
reslice render --preset tpu7x-8x8x48 --slices 1 --run llm --image us-docker.pkg.dev/proj/repo/reslice-trainer:v1 --run-dir gs://bucket/runs/llm --global-batch 12288 --config olmoe-1b --grace-period 300 --output tpu7x-8x8x48-1slice.yaml
reslice render --preset tpu7x-4x4x4 --slices 2 --run llm --image us-docker.pkg.dev/proj/repo/reslice-trainer:v1 --run-dir gs://bucket/runs/llm --global-batch 512 --config olmoe-1b --queue multislice-queue --tas-topology cloud.google.com/gke-nodepool --restart-mode in-place --output tpu7x-4x4x4-2slices-inplace.yaml
