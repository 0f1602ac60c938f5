#!/bin/sh
# TODO: minify css
cp -r posts public/
