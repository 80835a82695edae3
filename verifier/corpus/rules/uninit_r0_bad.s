# exit without setting r0
#@ type kprobe
#@ intent reject
exit
