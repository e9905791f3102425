#!/bin/sh
# Runs only if the sandbox survived and the bomb was stopped before verification.
if grep -qx started /app/bomb.txt 2>/dev/null; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
