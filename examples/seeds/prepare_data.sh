#!/usr/bin/env bash
# Lays out ./data as torchvision's datasets expect it (data/FashionMNIST/raw/*-ubyte,
# data/MNIST/raw/*-ubyte), so that the seeds' download=True finds the files and
# downloads nothing. Usage: prepare_data.sh DIR [MNIST_DIR]
#   DIR        where data/ is made
#   MNIST_DIR  a folder with MNIST's four IDX files (.gz or not); Debian has none
# Fashion-MNIST comes from Debian's dataset-fashion-mnist.
set -euo pipefail
dir=${1:?usage: prepare_data.sh DIR [MNIST_DIR]}
mnist=${2:-}
fashion=/usr/share/datasets/fashion-mnist
names=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)

unpack() {  # unpack FROM_DIR TO_DIR: each IDX file, gunzipped when it is .gz
  local from=$1 to=$2 name
  mkdir -p "$to"
  for name in "${names[@]}"; do
    [ -s "$to/$name" ] && continue
    if [ -f "$from/$name.gz" ]; then
      gzip -dc "$from/$name.gz" > "$to/$name.tmp" && mv "$to/$name.tmp" "$to/$name"
    elif [ -f "$from/$name" ]; then
      cp "$from/$name" "$to/$name"
    else
      echo "prepare_data: $from has no $name(.gz)" >&2
      exit 1
    fi
  done
}

[ -d "$fashion" ] || { echo "prepare_data: $fashion is missing (apt-get install dataset-fashion-mnist)" >&2; exit 1; }
unpack "$fashion" "$dir/data/FashionMNIST/raw"
if [ -n "$mnist" ]; then unpack "$mnist" "$dir/data/MNIST/raw"; fi
