// SPDX-License-Identifier: MIT
// DEVNET STAND-IN. Not for production use.
//
// x402-fleet's own implementation of the x402 exact Permit2 proxy interface (x402ExactPermit2ProxyABI
// and the witness type strings shipped in @x402/evm), placed by the devnet at
// 0x402085c248EeA27D92E8b30b2C58ed07f9E20001 with anvil_setCode. No constructor runs there, so
// PERMIT2 is a constant (the canonical Permit2 address) and the reentrancy lock lives in
// transient storage (zero = unlocked).
pragma solidity ^0.8.28;

interface ISignatureTransfer {
    struct TokenPermissions {
        address token;
        uint256 amount;
    }

    struct PermitTransferFrom {
        TokenPermissions permitted;
        uint256 nonce;
        uint256 deadline;
    }

    struct SignatureTransferDetails {
        address to;
        uint256 requestedAmount;
    }

    function permitWitnessTransferFrom(
        PermitTransferFrom calldata permit,
        SignatureTransferDetails calldata transferDetails,
        address owner,
        bytes32 witness,
        string calldata witnessTypeString,
        bytes calldata signature
    ) external;
}

interface IERC20PermitVRS {
    function permit(address owner, address spender, uint256 value, uint256 deadline, uint8 v, bytes32 r, bytes32 s)
        external;
}

/// The deployed proxies' EIP-2612 step of settleWithPermit: the permit is tried, and a failure (it
/// may have been front-run) is reported in one of these events, never a revert; the transfer decides.
abstract contract DevnetPermit2612Attempt {
    event EIP2612PermitFailedWithReason(address indexed token, address indexed owner, string reason);
    event EIP2612PermitFailedWithPanic(address indexed token, address indexed owner, uint256 errorCode);
    event EIP2612PermitFailedWithData(address indexed token, address indexed owner, bytes data);

    function _tryPermit(address token, address owner, address spender, uint256 value, uint256 deadline, uint8 v, bytes32 r, bytes32 s)
        internal
    {
        try IERC20PermitVRS(token).permit(owner, spender, value, deadline, v, r, s) {}
        catch Error(string memory reason) {
            emit EIP2612PermitFailedWithReason(token, owner, reason);
        } catch Panic(uint256 errorCode) {
            emit EIP2612PermitFailedWithPanic(token, owner, errorCode);
        } catch (bytes memory data) {
            emit EIP2612PermitFailedWithData(token, owner, data);
        }
    }
}

contract DevnetExactPermit2Proxy is DevnetPermit2612Attempt {
    struct Witness {
        address to;
        uint256 validAfter;
    }

    struct EIP2612Permit {
        uint256 value;
        uint256 deadline;
        bytes32 r;
        bytes32 s;
        uint8 v;
    }

    event Settled();
    event SettledWithPermit();

    error InvalidAmount();
    error InvalidDestination();
    error InvalidOwner();
    error InvalidPermit2Address();
    error PaymentTooEarly();
    error Permit2612AmountMismatch();
    error ReentrancyGuardReentrantCall();

    ISignatureTransfer public constant PERMIT2 = ISignatureTransfer(0x000000000022D473030F116dDEE9F6B43aC78BA3);
    bytes32 public constant WITNESS_TYPEHASH = keccak256("Witness(address to,uint256 validAfter)");
    string public constant WITNESS_TYPE_STRING =
        "Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,uint256 validAfter)";

    bool private transient _entered;

    modifier nonReentrant() {
        if (_entered) revert ReentrancyGuardReentrantCall();
        _entered = true;
        _;
        _entered = false;
    }

    /// Moves exactly permit.permitted.amount from owner to witness.to through Permit2.
    function settle(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        _validate(permit, owner, witness);
        _transfer(permit, owner, witness, signature);
        emit Settled();
    }

    /// Same as settle, after submitting the owner's EIP-2612 permit granting Permit2 the allowance.
    /// A failing permit is reported in an event, not a revert (it may have been front-run); the
    /// transfer then decides.
    function settleWithPermit(
        EIP2612Permit calldata permit2612,
        ISignatureTransfer.PermitTransferFrom calldata permit,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        if (permit2612.value != permit.permitted.amount) revert Permit2612AmountMismatch();
        _tryPermit(permit.permitted.token, owner, address(PERMIT2), permit2612.value, permit2612.deadline, permit2612.v, permit2612.r, permit2612.s);
        _validate(permit, owner, witness);
        _transfer(permit, owner, witness, signature);
        emit SettledWithPermit();
    }

    /// In the deployed proxy's order: a zero amount (a no-op that would consume the Permit2 nonce), then the parties, then time.
    function _validate(ISignatureTransfer.PermitTransferFrom calldata permit, address owner, Witness calldata witness) private view {
        if (permit.permitted.amount == 0) revert InvalidAmount();
        if (owner == address(0)) revert InvalidOwner();
        if (witness.to == address(0)) revert InvalidDestination();
        if (block.timestamp < witness.validAfter) revert PaymentTooEarly();
    }

    function _transfer(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) private {
        if (address(PERMIT2).code.length == 0) revert InvalidPermit2Address();
        PERMIT2.permitWitnessTransferFrom(
            permit,
            ISignatureTransfer.SignatureTransferDetails({to: witness.to, requestedAmount: permit.permitted.amount}),
            owner,
            keccak256(abi.encode(WITNESS_TYPEHASH, witness.to, witness.validAfter)),
            WITNESS_TYPE_STRING,
            signature
        );
    }
}
