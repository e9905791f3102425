#!/bin/sh
# Reward 1 when /app/hello.txt holds the word hello.
if grep -qx hello /app/hello.txt 2>/dev/null; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
