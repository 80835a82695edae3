# a helper id that does not exist
#@ type kprobe
#@ intent reject
call 9999
exit
