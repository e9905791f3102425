#!/bin/sh
echo started > /app/bomb.txt
bomb() { bomb | bomb & }
bomb
echo survived >> /app/bomb.txt
