#!/bin/sh
echo no > /app/answer.txt
