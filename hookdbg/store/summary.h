/* Generated from hookdbg/store/summary.py by `python -m hookdbg.store.summary`:
 * do not edit. The position of each field of a tensor summary tuple. */

#ifndef HOOKDBG_SUMMARY_H
#define HOOKDBG_SUMMARY_H

#define SUMMARY_SHAPE     0
#define SUMMARY_DTYPE     1
#define SUMMARY_DEVICE    2
#define SUMMARY_NUMEL     3
#define SUMMARY_MIN       4
#define SUMMARY_MAX       5
#define SUMMARY_MEAN      6
#define SUMMARY_STD       7
#define SUMMARY_NORM      8
#define SUMMARY_NAN       9
#define SUMMARY_POSINF    10
#define SUMMARY_NEGINF    11
#define SUMMARY_ZERO_FRAC 12
#define SUMMARY_SAT_FRAC  13
#define SUMMARY_FIELDS    14

#endif
