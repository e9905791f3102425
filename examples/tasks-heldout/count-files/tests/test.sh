#!/bin/sh
# Reward 1 when /app/count.txt holds the number of other files in /app.
if [ "$(cat /app/count.txt 2>/dev/null)" = "$(ls /app | grep -vx count.txt | wc -l | tr -d " ")" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
