#!/bin/sh
# Reward 1 when the sandbox sees loopback only: the network is off.
if [ "$(cat /app/interfaces.txt 2>/dev/null)" = lo ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
