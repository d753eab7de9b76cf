#!/usr/bin/env bash
# One device call whose work depends on the GPU that came (the tool may give an H100 for an H200 request):
#   bash tools/gpu_any.sh TAG "PARTS IF H200" "PARTS IF OTHER"   (parts of tools/gpu_land_dequant.sh, in order)
tag=$1; h200=$2; other=$3
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
case $gpu in *H200*) parts=$h200 ;; *) parts=$other ;; esac
for p in $parts; do bash tools/gpu_land_dequant.sh "$p" "${tag}_$p"; done
