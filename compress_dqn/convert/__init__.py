"""What needs TensorFlow to leave the tool: conversion to SavedModel and TFLite, the SavedModel runtime, GPU figures."""
