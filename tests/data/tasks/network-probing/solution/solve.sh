#!/bin/sh
sed -n '3,$s/:.*//p' /proc/net/dev | tr -d ' ' > /app/interfaces.txt
