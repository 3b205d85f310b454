"""Algorithms as registered parts (``registry``): advantage estimators and policy losses by name, which a preset
in conf/algo picks. ``inputs`` holds LossInputs/LossOutputs, ``loss`` the maths the losses share."""
