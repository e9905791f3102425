#!/bin/sh
n=$(ls /app | wc -l | tr -d " ")
echo "$n" > /app/count.txt
