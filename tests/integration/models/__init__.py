"""Integration tests: s2t/models/ and s2t/gate/: conversion, signatures, parity."""
