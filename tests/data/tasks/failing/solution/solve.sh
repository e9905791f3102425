#!/bin/sh
# A wrong solution: the oracle of this task scores 0, so `runctl task check` calls it unsound.
echo goodbye > /app/hello.txt
