#!/bin/sh
# Reward 1 when the hog was stopped (non-zero status) and the sandbox kept working.
s=$(cat /app/hog-status 2>/dev/null)
if [ -n "$s" ] && [ "$s" != 0 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
