#!/usr/bin/env bash
# The real-data comparison of docs/results/real_data.md, with the exact commands:
#
#   bash scripts/real_data.sh prepare                  # tokenizer folder, MLM corpus (Persuasion held out), attribution
#                                                      # and same-novel pair sets (train / validation / test chapters)
#   bash scripts/real_data.sh run pretrain             # Orchid-BERT and BertForMaskedLM, side by side
#   bash scripts/real_data.sh run images               # Fashion-MNIST: Orchid-ViT, ViT (2 seeds each), logistic regression
#   bash scripts/real_data.sh run attribution bert-lr  # fine-tuning (pretrained and from scratch, 128 and 512 tokens,
#                                                      # 2 seeds); BERT pretrained again at a lower learning rate
#   bash scripts/real_data.sh run attribution-variants # the pretrained Orchid at 128 tokens with mean pooling, and
#                                                      # with its filters in the common parameter group (2 seeds)
#   bash scripts/real_data.sh run pairs                # same novel or not, pairs of 64-token passages, as `attribution`
#   bash scripts/real_data.sh run grid                 # both architectures, pretrained and from scratch, on attribution
#                                                      # 128, 512 and 2048 and the pairs: the pooling and learning
#                                                      # rate chosen on the validation chapters, then 3 seeds at them
#                                                      # on the test chapters (2048: the long-context stage's models)
#   bash scripts/real_data.sh run text-floor           # the grid's tasks by logistic regression on token frequencies
#   bash scripts/real_data.sh run pair-probe           # the pair task by logistic regression on frozen features of
#                                                      # both architectures, pretrained and at random initialisation
#   bash scripts/real_data.sh run long-context         # masked-LM pretraining of small models at 128, 512 and 2048
#                                                      # tokens on the same number of tokens (Orchid and BERT from
#                                                      # scratch, Orchid extended from 128 tokens), then each model
#                                                      # scored on the held-out novel at every length it can read
#   bash scripts/real_data.sh report                   # docs/results/real_data.md and long_context.md, their JSON and
#                                                      # plots, from the runs
#
# `run` puts the jobs of the stages it is given in one queue and runs JOBS of them at a time, each on THREADS (one)
# thread, so the two cores are shared alike by the models compared; the `grid` stage then goes task by task, each
# task's seeds in a second queue after its grid points, and `long-context` in three queues (the runs from scratch
# and the model to extend, the extensions, the evaluations) before the grid, whose 2048-token task fine-tunes its
# models. A job whose output folder already holds results.json (a
# finished run) is skipped, so a stopped `run` picks up where it was: delete a run's folder to run it again. NICE
# (default 0) is the niceness of every job. DATA is the folder of ../shared/data's layout (austen/,
# bert-base-uncased/, fashion-mnist/); `bash scripts/real_data.sh jobs STAGE` prints a stage's commands in the order
# `run` runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
OUT=${OUT:-outputs/real_data}
JOBS=${JOBS:-2}
THREADS=${THREADS:-1}
PY=${PY:-.venv/bin/python}
NICE=${NICE:-0}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# ATen picks its vectorised CPU kernels by the host's vector width, and its AVX-512 kernels round differently from
# its AVX2 ones (softmax, for one): pinned to AVX2, which every x86-64 host these runs use has, all of them compute
# with one kernel set. Other libraries' paths (MKL's) may still differ between processors, so a model pretrained
# again on another host equals the first to rounding, not bit for bit.
export ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-avx2}
mkdir -p "$OUT"

# The two text models: the same width, depth and MLP size; positions up to TEXT_POSITIONS so that one pretrained
# model serves both passage lengths up to it.
TEXT_POSITIONS=512
ORCHID_TEXT=hidden_size=256,num_hidden_layers=4,intermediate_size=1024,max_position_embeddings=$TEXT_POSITIONS
BERT_TEXT=$ORCHID_TEXT,num_attention_heads=4
# The image models: 28x28 grey images in 4x4 patches (49 tokens), width 128, 4 layers.
ORCHID_IMAGE=image_size=28,num_channels=1,patch_size=4,hidden_size=128,num_hidden_layers=4,intermediate_size=256
VIT_IMAGE=$ORCHID_IMAGE,num_attention_heads=4
FASHION_CLASSES=("T-shirt/top" Trouser Pullover Dress Coat Sandal Shirt Sneaker Bag "Ankle boot")

# The long-context comparison (docs/results/long_context.md): small models, the same width, depth and MLP size for
# both architectures; each length of CONTEXT_LENGTHS trains CONTEXT_STEPS steps of CONTEXT_TOKENS_PER_STEP tokens
# (CONTEXT_TOKENS_PER_STEP / length blocks a step), so every run sees the same number of training tokens. The
# extended Orchid models start from one pretrained at the shortest length for CONTEXT_BASE_STEPS of those steps and
# train the rest at their length. CONTEXT_BERT_LENGTHS narrows BERT's runs.
ORCHID_CONTEXT=hidden_size=128,num_hidden_layers=4,intermediate_size=512
BERT_CONTEXT=$ORCHID_CONTEXT,num_attention_heads=4
CONTEXT_LENGTHS=${CONTEXT_LENGTHS:-"128 512 2048"}
CONTEXT_BERT_LENGTHS=${CONTEXT_BERT_LENGTHS:-$CONTEXT_LENGTHS}
CONTEXT_STEPS=${CONTEXT_STEPS:-400}
CONTEXT_BASE_STEPS=${CONTEXT_BASE_STEPS:-300}
CONTEXT_TOKENS_PER_STEP=${CONTEXT_TOKENS_PER_STEP:-4096}
# The recipe's evaluations during training read this many held-out tokens at every length.
CONTEXT_EVAL_TOKENS=${CONTEXT_EVAL_TOKENS:-32768}

# Runs the commands read from stdin, one per line, JOBS at a time, at niceness NICE; each one's output goes to the
# log it names last. A command whose --output_dir holds results.json is skipped.
run_all() {
    local line
    while IFS= read -r line; do
        [ -n "$line" ] || continue
        [[ "$line" =~ --output_dir\ ([^ ]+) ]] && [ -f "${BASH_REMATCH[1]}/results.json" ] && continue
        echo "$line"
    done | nice -n "$NICE" xargs -r -P "$JOBS" -I{} -d '\n' bash -c '{}'
}

MLM="--train_file $OUT/austen/mlm/train.txt --validation_file $OUT/austen/mlm/validation.txt \
--tokenizer_name $OUT/austen/tokenizer --max_seq_length 128 --per_device_train_batch_size 32 \
--per_device_eval_batch_size 32 --max_steps 400 --eval_strategy steps --eval_steps 50 --logging_steps 10 \
--max_eval_samples 256 --eval_before_training --save_strategy no --report_to none --threads $THREADS --seed 0 --bf16 False"

# Pretraining at LENGTH tokens for STEPS steps on the MLM corpus, with the MLM runs' settings, evaluated by the recipe
# before training and four times during it: `context_args LENGTH STEPS`.
context_args() {
    local blocks=$((CONTEXT_TOKENS_PER_STEP / $1))
    echo "--train_file $OUT/austen/mlm/train.txt --validation_file $OUT/austen/mlm/validation.txt \
--max_seq_length $1 --per_device_train_batch_size $blocks --per_device_eval_batch_size $blocks --max_steps $2 \
--eval_strategy steps --eval_steps $(($2 / 4)) --logging_steps 10 --max_eval_samples $((CONTEXT_EVAL_TOKENS / $1)) \
--eval_before_training --save_strategy no --report_to none --threads $THREADS --seed 0 --bf16 False --disable_tqdm True"
}

# GNU time's report on the command that follows it (with its peak memory, `Maximum resident set size`) in
# OUT/NAME.time: `timed NAME`.
timed() {
    echo "/usr/bin/time -v -o $OUT/$1.time"
}

# Fine-tuning on TASK (a folder of prepare: attribution-128, attribution-512, pairs-128; its number is the sequence
# length), trained on the TRAIN file and evaluated on the EVAL file of that folder: `finetune_args TASK TRAIN EVAL`.
# Every run computes in float32 (no bfloat16 or TensorFloat-32 on a GPU either), so a run means the same anywhere.
# A step takes 32 passages, or 16,384 tokens where 32 passages would be more (8 passages of 2048 tokens).
finetune_args() {
    local length=${1##*-} batch=32
    [ $((32 * length)) -le 16384 ] || batch=$((16384 / length))
    echo "--train_file $OUT/austen/$1/$2.csv --validation_file $OUT/austen/$1/$3.csv --max_seq_length $length \
--per_device_train_batch_size $batch --save_strategy no --report_to none --threads $THREADS --disable_tqdm True \
--bf16 False --tf32 False"
}

# The model of a fine-tuning run: `model_args ARCH INIT [LENGTH]`, INIT pretrained or scratch. Up to TEXT_POSITIONS
# tokens, the pretrain stage's model or its configuration; longer passages (the 2048-token attribution task), the
# long-context stage's model pretrained from scratch at LENGTH (ctx-ARCH-LENGTH) or its configuration.
model_args() {
    local length=${3:-128} pretrained=$OUT/pretrain-$1 orchid=$ORCHID_TEXT bert=$BERT_TEXT
    if [ "$length" -gt "$TEXT_POSITIONS" ]; then
        pretrained=$OUT/ctx-$1-$length
        orchid=$ORCHID_CONTEXT,max_position_embeddings=$length
        bert=$BERT_CONTEXT,max_position_embeddings=$length
    fi
    if [ "$2" = pretrained ]; then
        echo "--model_name_or_path $pretrained"
    else
        echo "--model_type $1 --config_overrides $([ "$1" = orchid ] && echo "$orchid" || echo "$bert") \
--tokenizer_name $OUT/austen/tokenizer"
    fi
}

# One setting for every model and variant: trained on the training and validation chapters (trainval.csv),
# evaluated on the test chapters. The recipe's learning rate (5e-5) is BERT-base's for a converged checkpoint; in
# one epoch it leaves these briefly pretrained models at the majority class, so every run takes 2e-4.
fixed_args() {
    echo "$(finetune_args "$1" trainval test) --num_train_epochs 1 --learning_rate 2e-4"
}
attribution_args() { fixed_args "attribution-$1"; }

# The grid: the same poolings, learning rates and epochs for both architectures (BERT's classifier pools the mean as
# Orchid's does through scripts/real_data_finetune.py), each point trained on the training chapters with seed 0 and
# scored on the validation chapters; the best point (on ties the lowest learning rate, then the first token) is
# trained again with every seed of GRID_SEEDS and scored on the test chapters.
# GRID_TASKS, GRID_ARCHS and GRID_INITS narrow the grid to some tasks, architectures or initialisations (to share it
# between machines, say: the runs from scratch need no pretrained model); GRID_LEARNING_RATES extends it where a
# model's best point is at an end of the default rates.
GRID_TASKS=${GRID_TASKS:-"attribution-128 attribution-512 pairs-128 attribution-2048"}
GRID_ARCHS=${GRID_ARCHS:-"orchid bert"}
GRID_INITS=${GRID_INITS:-"pretrained scratch"}
GRID_POOLINGS="first mean"
GRID_LEARNING_RATES=${GRID_LEARNING_RATES:-"1e-4 3e-4 1e-3 3e-3 1e-2"}
GRID_SEEDS="0 1 2"

# The epochs of a grid run on TASK: 3, and 1 for passages longer than TEXT_POSITIONS (attribution-2048), where
# BERT's attention makes an epoch several times as long as Orchid's (docs/results/long_context.md):
# `grid_epochs TASK`.
grid_epochs() {
    [ "${1##*-}" -le "$TEXT_POSITIONS" ] && echo 3 || echo 1
}

# The commands of STAGE in PHASE (1, or 2 for the grid's seeds), for the grid only those of TASKS (default
# GRID_TASKS): `jobs STAGE PHASE [TASKS]`.
jobs() {
    local phase=${2:-1} tasks=${3:-$GRID_TASKS}
    case "$1" in
    pretrain)
        echo "$PY scripts/pretrain_mlm.py $MLM --config_overrides $ORCHID_TEXT --output_dir $OUT/pretrain-orchid \
> $OUT/pretrain-orchid.log 2>&1"
        echo "$PY scripts/pretrain_mlm.py $MLM --model_type bert --config_overrides $BERT_TEXT \
--output_dir $OUT/pretrain-bert > $OUT/pretrain-bert.log 2>&1"
        ;;
    bert-lr)
        # The recipe's peak learning rate (8e-4) is Orchid's and M2-BERT's; BERT again at 2e-4, nothing else changed.
        echo "$PY scripts/pretrain_mlm.py $MLM --learning_rate 2e-4 --model_type bert --config_overrides $BERT_TEXT \
--output_dir $OUT/pretrain-bert-lr2e-4 > $OUT/pretrain-bert-lr2e-4.log 2>&1"
        ;;
    attribution)
        # Pretrained models first: theirs is the main comparison.
        for init in pretrained scratch; do
            for length in 128 512; do
                for seed in 0 1; do
                    for arch in orchid bert; do
                        local data="$(attribution_args $length) --seed $seed"
                        local name=$OUT/attribution-$length-$arch-$init-s$seed
                        # Orchid pools its first token here, as BERT pools its [CLS] token; the recipe's mean
                        # pooling for Orchid is the attribution-variants stage's mean-pooling run.
                        [ $arch = orchid ] && data="$data --pooling first"
                        echo "$PY scripts/finetune_glue.py $data $(model_args $arch $init) --output_dir $name \
> $name.log 2>&1"
                    done
                done
            done
        done
        ;;
    attribution-variants)
        # The attribution stage's pretrained Orchid at 128 tokens again, one change at a time: mean pooling over the
        # real tokens instead of the first token, and the implicit filters' parameters in the common parameter group.
        local data="$(attribution_args 128) --model_name_or_path $OUT/pretrain-orchid"
        for seed in 0 1; do
            for variant in "mean-pooling:--pooling mean" \
                "no-filter-group:--filter_param_group False --pooling first"; do
                local name=$OUT/attribution-128-orchid-pretrained-${variant%%:*}-s$seed
                echo "$PY scripts/finetune_glue.py $data --seed $seed ${variant#*:} --output_dir $name > $name.log 2>&1"
            done
        done
        ;;
    pairs)
        # The attribution stage's setting on the pair task; each model pools as the recipe has it (Orchid: the mean).
        for init in pretrained scratch; do
            for seed in 0 1; do
                for arch in orchid bert; do
                    local name=$OUT/pairs-128-$arch-$init-s$seed
                    echo "$PY scripts/finetune_glue.py $(fixed_args pairs-128) --seed $seed $(model_args $arch $init) \
--output_dir $name > $name.log 2>&1"
                done
            done
        done
        ;;
    grid)
        # The grid points (phase 1), then the chosen point's seeds (phase 2), whose pooling and learning rate are
        # read from the grid's results when the job starts.
        for task in $tasks; do
            for init in $GRID_INITS; do
                for arch in $GRID_ARCHS; do
                    local group=grid-$task-$arch-$init model epochs
                    model=$(model_args $arch $init ${task##*-})
                    epochs=$(grid_epochs $task)
                    if [ "$phase" = 1 ]; then
                        for pooling in $GRID_POOLINGS; do
                            for lr in $GRID_LEARNING_RATES; do
                                local name=$OUT/$group-$pooling-lr$lr-s0
                                echo "$PY scripts/real_data_finetune.py $(finetune_args $task train validation) \
--num_train_epochs $epochs --pooling $pooling --learning_rate $lr --seed 0 $model --output_dir $name > $name.log 2>&1"
                            done
                        done
                    else
                        for seed in $GRID_SEEDS; do
                            local name=$OUT/$group-chosen-s$seed
                            echo "point=\$($PY scripts/real_data_report.py --runs $OUT --choose $group \
--grid_poolings $GRID_POOLINGS --grid_learning_rates $GRID_LEARNING_RATES) && \
$PY scripts/real_data_finetune.py $(finetune_args $task train test) --num_train_epochs $epochs \
--pooling \${point% *} --learning_rate \${point#* } --seed $seed $model --output_dir $name > $name.log 2>&1"
                        done
                    fi
                done
            done
        done
        ;;
    text-floor)
        # The floor of the grid's tasks: C chosen on the validation chapters, scored on the test chapters.
        for task in $GRID_TASKS; do
            echo "OMP_NUM_THREADS=$THREADS $PY scripts/text_baseline.py --task_dir $OUT/austen/$task \
--tokenizer_name $OUT/austen/tokenizer --output_dir $OUT/floor-$task > $OUT/floor-$task.log 2>&1"
        done
        ;;
    pair-probe)
        # Is "same novel" in the features before any fine-tuning? The pretraining stage's models, and the same
        # configurations at random initialisation, frozen; C chosen on the validation chapters.
        for arch in orchid bert; do
            for init in pretrained random; do
                local name=$OUT/probe-pairs-128-$arch-$init
                echo "OMP_NUM_THREADS=$THREADS $PY scripts/pair_probe.py --task_dir $OUT/austen/pairs-128 \
--model_name_or_path $OUT/pretrain-$arch --init $init --output_dir $name > $name.log 2>&1"
            done
        done
        ;;
    long-context)
        # Phase 1: the runs from scratch at every length and the Orchid model to extend; phase 2: its extensions;
        # phase 3: every model scored at every length (scripts/long_context_eval.py).
        local short=${CONTEXT_LENGTHS%% *} length name model
        local base=ctx-orchid-$short-base rest=$((CONTEXT_STEPS - CONTEXT_BASE_STEPS))
        local scratch=() extended=()
        for length in $CONTEXT_LENGTHS; do
            scratch+=("ctx-orchid-$length")
            [[ " $CONTEXT_BERT_LENGTHS " == *" $length "* ]] && scratch+=("ctx-bert-$length")
            [ "$length" = "$short" ] || extended+=("ctx-orchid-$length-extended")
        done
        if [ "$phase" = 1 ]; then
            for name in "${scratch[@]}"; do
                length=${name##*-}
                model="--config_overrides $ORCHID_CONTEXT,max_position_embeddings=$length"
                [[ $name == ctx-bert-* ]] && model="--model_type bert --config_overrides \
$BERT_CONTEXT,max_position_embeddings=$length"
                echo "$(timed "$name") $PY scripts/pretrain_mlm.py $(context_args "$length" "$CONTEXT_STEPS") $model \
--tokenizer_name $OUT/austen/tokenizer --output_dir $OUT/$name > $OUT/$name.log 2>&1"
            done
            echo "$(timed "$base") $PY scripts/pretrain_mlm.py $(context_args "$short" "$CONTEXT_BASE_STEPS") \
--config_overrides $ORCHID_CONTEXT,max_position_embeddings=$short --tokenizer_name $OUT/austen/tokenizer \
--output_dir $OUT/$base > $OUT/$base.log 2>&1"
        elif [ "$phase" = 2 ]; then
            for name in "${extended[@]}"; do
                length=${name%-extended}
                length=${length##*-}
                # The recipe extends the checkpoint's context to --max_seq_length (docs/model.md, "Context extension").
                echo "$(timed "$name") $PY scripts/pretrain_mlm.py $(context_args "$length" "$rest") \
--model_name_or_path $OUT/$base --output_dir $OUT/$name > $OUT/$name.log 2>&1"
            done
        else
            for name in "${scratch[@]}" "$base" "${extended[@]}"; do
                echo "$PY scripts/long_context_eval.py --model_name_or_path $OUT/$name \
--validation_file $OUT/austen/mlm/validation.txt --train_file $OUT/austen/mlm/train.txt --lengths $CONTEXT_LENGTHS \
--one_transform_length --threads $THREADS --output_dir $OUT/ctx-eval-${name#ctx-} > $OUT/ctx-eval-${name#ctx-}.log 2>&1"
            done
        fi
        ;;
    images)
        local common="--train_dir $DATA/fashion-mnist --class_names ${FASHION_CLASSES[*]@Q} \
--recipe orchid-vit-digits --num_train_epochs 5 --warmup_epochs 1 --crop_padding 2 --hflip True \
--save_strategy no --report_to none --threads $THREADS --disable_tqdm True"
        for seed in 0 1; do
            echo "$PY scripts/train_image.py $common --seed $seed --config_overrides $ORCHID_IMAGE \
--output_dir $OUT/fashion-orchid-s$seed > $OUT/fashion-orchid-s$seed.log 2>&1"
            echo "$PY scripts/train_image.py $common --seed $seed --model_type vit --config_overrides $VIT_IMAGE \
--output_dir $OUT/fashion-vit-s$seed > $OUT/fashion-vit-s$seed.log 2>&1"
        done
        echo "OMP_NUM_THREADS=$THREADS $PY scripts/image_baseline.py --train_dir $DATA/fashion-mnist \
--class_names ${FASHION_CLASSES[*]@Q} --max_iter 1000 --output_dir $OUT/fashion-logreg > $OUT/fashion-logreg.log 2>&1"
        ;;
    esac
}

STAGES=" pretrain bert-lr attribution attribution-variants pairs grid text-floor pair-probe images long-context "
# The queues of the STAGES given, in order, each as its commands followed by an empty line: the stages other than
# the grid and long-context in one queue, then the three phases of long-context, then for each task of the grid its
# points, then its seeds.
queues() {
    local stage task phase grid=no context=no
    for stage in "$@"; do
        case "$stage" in
        grid) grid=yes ;;
        long-context) context=yes ;;
        *) jobs "$stage" ;;
        esac
    done
    echo
    if [ $context = yes ]; then
        for phase in 1 2 3; do
            jobs long-context $phase
            echo
        done
    fi
    if [ $grid = yes ]; then
        for task in $GRID_TASKS; do
            for phase in 1 2; do
                jobs grid $phase "$task"
                echo
            done
        done
    fi
}

case "${1:-}" in
prepare)
    $PY scripts/prepare_novels.py --novels "$DATA"/austen/*.txt --held_out persuasion \
        --vocab_dir "$DATA/bert-base-uncased" --passage_tokens 128 512 2048 --pair_tokens 64 --output_dir "$OUT/austen"
    ;;
jobs | run)
    command=$1
    shift
    [ $# -gt 0 ] || { echo "usage: bash scripts/real_data.sh $command STAGE [STAGE ...]" >&2; exit 2; }
    for stage in "$@"; do
        [[ "$STAGES" == *" $stage "* ]] || { echo "unknown stage '$stage'; the stages are$STAGES" >&2; exit 2; }
    done
    if [ "$command" = jobs ]; then
        queues "$@" | grep -v '^$' || true
    else
        queue=""
        while IFS= read -r line; do
            if [ -n "$line" ]; then queue+="$line"$'\n'; continue; fi
            [ -z "$queue" ] || printf '%s' "$queue" | run_all
            queue=""
        done < <(queues "$@")
    fi
    ;;
report)
    $PY scripts/real_data_report.py --runs "$OUT" --threads-per-run "$THREADS" --jobs "$JOBS"
    ;;
*)
    echo "usage: bash scripts/real_data.sh {prepare|run STAGE...|jobs STAGE...|report}" >&2
    exit 2
    ;;
esac
