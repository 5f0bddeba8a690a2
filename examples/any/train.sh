#!/bin/sh
# A training job that knows nothing of spotwise: plain sh, its whole state (the step and a
# running checksum standing in for the weights) in one file it saves itself. Under
# `spotwise run` a spot notice arrives as SIGTERM; the job finishes the step it is in, saves,
# and exits. Relaunched, it resumes from the file and ends with the checksum of a run that was
# never interrupted.
#   sh train.sh                           # alone: STATE_DIR=. STEPS=60
#   spotwise run -- sh train.sh           # as the training process of a job (job.yaml)
set -eu
state="${SPOTWISE_CHECKPOINT_DIR:-${STATE_DIR:-.}}/state"
steps="${STEPS:-60}"
step=0
sum=0
if [ -f "$state" ]; then
    read -r step sum < "$state"
    echo "resumed from step $step"
fi

save() {  # write then rename: a kill at any instant leaves the old state or the new one
    mkdir -p "$(dirname "$state")"
    echo "$step $sum" > "$state.tmp"
    mv "$state.tmp" "$state"
}

stop=0
trap 'stop=1' TERM  # only a flag: the step in progress finishes first (a step boundary)

while [ "$step" -lt "$steps" ]; do
    if [ "$stop" = 1 ]; then
        save
        echo "saved at step $step on the notice (${SPOTWISE_NOTICE_FILE:-no notice file})"
        exit 0  # any code: spotwise run reports 75, so the controller relaunches the job
    fi
    sum=$(( (sum * 31 + step * step + 7) % 1000000007 ))  # "one training step"
    step=$((step + 1))
    if [ $((step % 10)) -eq 0 ]; then
        save
    fi
    sleep "${STEP_S:-0.1}" || :  # the notice reaches the whole group: sleep ends early
done
save
echo "final-checksum: $sum"
