# without tail calls a kprobe program's frames still share one stack (6.1 and
# 6.18 give it no private stacks; 6.13 to 6.17 did): 3 x 256 bytes do not fit
#@ type kprobe
#@ intent reject
stdw [%r10-256], 0
call local f
exit
f:
stdw [%r10-256], 0
call local g
exit
g:
stdw [%r10-256], 0
mov %r0, 0
exit
