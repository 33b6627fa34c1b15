#!/usr/bin/env bash
# Fashion-MNIST in two dimensions (docs/results/images_2d.md): ViT, Orchid-ViT mixing the patches as one sequence
# (1-D), over their grid (2-D) and the 2-D hybrid (2-D Orchid layers first, then ViT attention), at 4x4 patches (49
# tokens) and 2x2 patches (196 tokens), the same recipe and budget for all; the learning rate chosen on a validation
# split cut from the training images, then two seeds at it scored on the test images; the logistic-regression floor.
#
#   bash scripts/images_2d.sh prepare     # OUT/fashion-train: the training images alone (their held-out split is
#                                         # the validation split; the test images are never seen by the grid)
#   bash scripts/images_2d.sh jobs [grid|test]  # the commands, in the order `run` runs them
#   bash scripts/images_2d.sh run         # runs them, JOBS at a time: the floor and the grid, then the seeds (each
#                                         # needs its grid); a run whose folder holds results.json is skipped, so
#                                         # a stopped `run` picks up where it was
#   bash scripts/images_2d.sh report      # docs/results/images_2d/*.json, the tables of docs/results/images_2d.md
#
# PATCHES (default "4 2") and MODELS (default "vit orchid-1d orchid-2d orchid-2d-hybrid") narrow the runs; THREADS
# (default 1) threads per run; JOBS (default 2) runs at a time, so that the two cores are shared alike by the models
# compared; NICE (default 0) their niceness; TRAIN_IMAGES (default 15000) the training images of every run, a random
# subset of that many (a fraction of an epoch, the budget of a CPU); EPOCHS (default 1) the passes over them;
# LEARNING_RATES (default "1e-3 2e-3 4e-3") the grid; SEEDS (default "0 1") the seeds trained at the chosen rate;
# BLOCK_PREFIX (default none) the prefix of the report's blocks, for a second set of runs on the same page (with its
# own OUT and RESULTS); README_FILE (default README.md) the file whose images-2d headline block the report fills
# ('' for none).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
OUT=${OUT:-outputs/images_2d}
THREADS=${THREADS:-1}
NICE=${NICE:-0}
JOBS=${JOBS:-2}
PY=${PY:-.venv/bin/python}
PATCHES=${PATCHES:-"4 2"}
MODELS=${MODELS:-"vit orchid-1d orchid-2d orchid-2d-hybrid"}
TRAIN_IMAGES=${TRAIN_IMAGES:-15000}
EPOCHS=${EPOCHS:-1}
LEARNING_RATES=${LEARNING_RATES:-"1e-3 2e-3 4e-3"}
SEEDS=${SEEDS:-"0 1"}
BATCH=64
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
FASHION_CLASSES=("T-shirt/top" Trouser Pullover Dress Coat Sandal Shirt Sneaker Bag "Ankle boot")

# Every model: 28x28 grey images, width 128, 4 layers, MLP 256 (the real-data comparison's image models); ViT and
# the hybrid's attention layers with 4 heads.
COMMON=image_size=28,num_channels=1,hidden_size=128,num_hidden_layers=4,intermediate_size=256
model_args() {  # MODEL PATCH
    local shape=$COMMON,patch_size=$2
    case "$1" in
    vit) echo "--model_type vit --config_overrides $shape,num_attention_heads=4" ;;
    orchid-1d) echo "--config_overrides $shape" ;;
    orchid-2d) echo "--config_overrides $shape,image_mixer=2d" ;;
    orchid-2d-hybrid) echo "--config_overrides $shape,image_mixer=2d,layer_types=orchid-first,num_attention_heads=4" ;;
    *) echo "unknown model '$1'" >&2; exit 2 ;;
    esac
}

# The recipe of every run: orchid-vit-digits' AdamW, cosine schedule, weight decay 0.05 and label smoothing 0.1,
# batch 64, EPOCHS passes over TRAIN_IMAGES images with a tenth of their steps of warmup, random crops after 2-pixel
# padding and horizontal flips; no evaluation during training, so that the training time is training alone.
WARMUP=$(( TRAIN_IMAGES * EPOCHS / BATCH / 10 ))
RECIPE="--class_names ${FASHION_CLASSES[*]@Q} --recipe orchid-vit-digits --num_train_epochs $EPOCHS \
--max_train_samples $TRAIN_IMAGES --per_device_train_batch_size $BATCH --per_device_eval_batch_size 256 \
--warmup_steps $WARMUP --crop_padding 2 --hflip True --eval_strategy no --save_strategy no --report_to none \
--threads $THREADS --disable_tqdm True"
# The grid: trained on the training images less a stratified tenth (split seed 0), scored on that tenth.
GRID_DATA="--train_dir $OUT/fashion-train --train_val_split 0.1 --split_seed 0"
# The seeds: trained on the training images, scored on the 10,000 test images.
TEST_DATA="--train_dir $DATA/fashion-mnist"

jobs() {  # PHASE: grid (the floor and the grid points), test (the seeds at the chosen rates) or both
    local phase=${1:-both}
    [ "$phase" = test ] || echo "OMP_NUM_THREADS=$THREADS $PY scripts/image_baseline.py --train_dir $DATA/fashion-mnist \
--class_names ${FASHION_CLASSES[*]@Q} --max_iter 1000 --output_dir $OUT/logreg > $OUT/logreg.log 2>&1"
    local patch model lr seed name
    for patch in $PATCHES; do
        for model in $MODELS; do
            for lr in $LEARNING_RATES; do
                [ "$phase" != test ] || continue
                name=$OUT/p$patch-$model-lr$lr-s0
                echo "$PY scripts/train_image.py $GRID_DATA $RECIPE $(model_args "$model" "$patch") --learning_rate $lr \
--seed 0 --output_dir $name > $name.log 2>&1"
            done
            for seed in $SEEDS; do
                [ "$phase" != grid ] || continue
                name=$OUT/p$patch-$model-chosen-s$seed
                echo "lr=\$($PY scripts/images_2d_report.py --runs $OUT --choose p$patch-$model \
--grid_learning_rates $LEARNING_RATES) && $PY scripts/train_image.py $TEST_DATA $RECIPE \
$(model_args "$model" "$patch") --learning_rate \$lr --seed $seed --output_dir $name > $name.log 2>&1"
            done
        done
    done
}

case "${1:-}" in
prepare)
    mkdir -p "$OUT/fashion-train"
    for file in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz; do
        ln -sf "$(realpath "$DATA/fashion-mnist/$file")" "$OUT/fashion-train/$file"
    done
    ;;
jobs)
    jobs "${2:-both}"
    ;;
run)
    [ -d "$OUT/fashion-train" ] || { echo "run 'bash scripts/images_2d.sh prepare' first" >&2; exit 2; }
    for phase in grid test; do
        jobs "$phase" | while IFS= read -r line; do
            [[ "$line" =~ --output_dir\ ([^ ]+) ]] && [ -f "${BASH_REMATCH[1]}/results.json" ] && continue
            echo "$line"
        done | nice -n "$NICE" xargs -r -P "$JOBS" -I{} -d '\n' \
            bash -c 'echo "$(date "+%F %T") $1" >&2; bash -c "$1" || echo "$(date "+%F %T") failed: $1" >&2' _ {}
    done
    ;;
report)
    $PY scripts/images_2d_report.py --runs "$OUT" --grid_learning_rates $LEARNING_RATES --threads-per-run "$THREADS" \
        --jobs "$JOBS" --results "${RESULTS:-docs/results/images_2d}" --block_prefix "${BLOCK_PREFIX:-}" \
        --readme "${README_FILE-README.md}"
    ;;
*)
    echo "usage: bash scripts/images_2d.sh {prepare|jobs|run|report}" >&2
    exit 2
    ;;
esac
