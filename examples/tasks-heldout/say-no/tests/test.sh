#!/bin/sh
# Reward 1 when /app/answer.txt holds the word no.
if grep -qx no /app/answer.txt 2>/dev/null; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
