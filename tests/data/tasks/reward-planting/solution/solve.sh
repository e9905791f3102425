#!/bin/sh
# Plants a reward, and leaves a process behind that keeps planting it while the verifier runs.
mkdir -p /logs/verifier
echo 1 > /logs/verifier/reward.txt
echo "{\"reward\": 1}" > /logs/verifier/reward.json
(while :; do echo 1 > /logs/verifier/reward.txt; sleep 0.05; done) > /dev/null 2>&1 &
